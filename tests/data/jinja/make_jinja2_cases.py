#!/usr/bin/env python3
# Produces jinja2_cases.json: Jinja snippets rendered by Python Jinja2 configured as transformers'
# apply_chat_template configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
# loopcontrols, its own tojson / raise_exception). tests/chat/jinja_test.cpp renders every case with
# lilac's engine and expects the same output, or an error where Jinja2 raised one.
#   python3 make_jinja2_cases.py > jinja2_cases.json      (needs: pip install jinja2)
# Left out: cases whose Jinja2 output is a Python object repr with an address (methods, generators,
# dict views), and {% generation %}, which needs transformers' AssistantTracker extension.
import json
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception

C = []


def add(src, ctx=None):
    C.append([src, ctx or {}])

def add(src, ctx=None): C.append([src, ctx or {}])
# whitespace control
add("a\n  {% if true %}\n    x\n  {% endif %}\nb")
add("a  {% if true %}x{% endif %}  b")
add("a\n  {%+ if true %}x{% endif %}\nb")
add("a\n  {%- if true -%}\n x \n {%- endif %}\nb")
add("{{ 'x' }}\n  {{ 'y' }}\n")
add("  {# comment #}\nA\n  {#- c -#}  B")
add("{% raw %}\n{{ x }}{% endraw %}\nafter")
add("  {% raw -%}  {{ x }} {%- endraw %}  ")
add("{% for i in range(3) %}\n{{ i }}\n{% endfor %}\n")
add("x {{- ' y ' -}} z")
add("line1\r\nline2\r\n{% if true %}\r\nz\r\n{% endif %}\r\n")
add("{% if true %}a{% endif %}\n\n")
add("text\n")
add("{{ 'a' }}{#\nmultiline comment\n#}\n{{ 'b' }}")
add("  {{ x }}  {% if 1 %}y{% endif %}", {"x": 1})
add("{% if true %}  {% endif %}|")
add("a {% if true %}\n{% endif %} b")
# expressions
add("{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
add("{{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e3 }} {{ 1.5e-7 }} {{ 10 ** 16 * 1.0 }} {{ 123456789.0 * 10000000 }} {{ 0.0001 }} {{ 0.00001 }} {{ -0.0 }}")
add("{{ 'a' ~ 1 ~ none ~ true ~ [1, 'b'] ~ {'k': 'v'} }}")
add("{{ 'ab' * 3 }} {{ [1] * 3 }} {{ [1, 2] + [3] }} {{ 'a' + 'b' }}")
add("{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ true == 1 }} {{ none == none }}")
add("{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ not 'a' in 'b' }}")
add("{{ x is defined }} {{ y is undefined }} {{ none is none }} {{ 1 is number }} {{ true is number }} {{ true is integer }} {{ 1.0 is float }} {{ 'a' is string }}", {"x": 1})
add("{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ {} is sequence }} {{ 'a' is sequence }} {{ u is sequence }} {{ u is iterable }} {{ 1 is iterable }} {{ none is iterable }}")
add("{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 1 is eq 1 }} {{ 2 is gt 1 }} {{ 'a' is lower }} {{ 'A' is upper }} {{ 2 is in [1, 2] }}")
add("{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ true is boolean }} {{ 1 is boolean }} {{ x is not none }}", {"x": 0})
add("{{ 'yes' if x else 'no' }} {{ 'yes' if y }}|{{ x and 'a' or 'b' }} {{ 0 or '' or 'z' }} {{ [] and 1 }}", {"x": 1})
add("{{ -x|abs }} {{ - 3 ** 2 }} {{ (-3) ** 2 }} {{ 2 ** 3 ** 2 }}", {"x": 5})
add("{{ 1 + 2 is number }}")
add("{{ 'abc'[0] }} {{ 'abc'[-1] }} {{ 'abc'[5] }}| {{ [1,2,3][1:] }} {{ [1,2,3][::-1] }} {{ 'hello'[1:4] }} {{ 'hello'[::2] }} {{ [1,2,3,4,5][-2:] }} {{ [1,2,3,4,5][4:1:-1] }} {{ 'héllo'[1] }}")
add("{{ x.a }} {{ x['a'] }} {{ x.b }}|{{ x.b is defined }} {{ l.0 }} {{ l[1] }} {{ x.items }}", {"x": {"a": 1}, "l": [5, 6]})
add("{{ (1, 2) }} {{ (1,) }} {{ () }} {{ [1, (2, 3)] }} {{ {'a': (1, 'x')} }}")
add("{{ 'a' 'b' \"c\" }} {{ '\\n\\t\\\\' | length }} {{ '\\u00e9\\x41' }} {{ 'it\\'s' }}")
add("{{ none }} {{ true }} {{ True }} {{ false }} {{ [none, true, 1.0, 'x'] }} {{ {'a': none} }} {{ 1_000 }}")
add("{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n', 'tab\\t', 'é', '\\x01', '\\u200b', '\\xa0'] }}")
add("{{ u }}|{{ u ~ 'x' }}|{{ u|default('d') }}|{{ ''|default('d') }}|{{ ''|default('d', true) }}|{{ none|default('d') }}|{{ u|d('z') }}")
add("{{ x.y.z }}", {"x": {}})
add("{{ u.attr }}")
add("{{ u[0] }}")
add("{{ u + 1 }}")
add("{{ u() }}")
add("{{ 1 + 'a' }}")
add("{{ 'a' < 1 }}")
add("{{ none.x }}|{{ none[0] }}|")
add("{{ 1 / 0 }}")
# for loops
add("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}")
add("{% for x in 'abc' %}{{ loop.previtem }}-{{ x }}-{{ loop.nextitem }},{% endfor %}")
add("{% for x in [] %}a{% else %}empty{% endfor %}")
add("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.index }}{{ loop.length }},{% else %}none{% endfor %}")
add("{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}={{ v }};{% endfor %}")
add("{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}", {"d": {"z": 1, "y": [1]}})
add("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}{% for (a, b) in [(1, 2)] %}{{ a }}{% endfor %}")
add("{% for x in [1,2,3,4,5] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}")
add("{% for x in [1,2] %}{% for y in 'ab' %}{{ loop.index }}{{ x }}{{ y }} {% endfor %}{{ loop.index }}|{% endfor %}")
add("{% for x in [1,2,3] %}{{ loop.cycle('a', 'b') }}{% endfor %}")
add("{% for x in [1,1,2,2,1] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}")
add("{% for x in u %}a{% else %}b{% endfor %}")
add("{% for x in none %}a{% endfor %}")
add("{% for x in 3 %}a{% endfor %}")
add("{% for a, b in [[1,2,3]] %}{% endfor %}")
# set / scoping
add("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}")
add("{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}")
add("{% set ns = namespace(x=1, y=[]) %}{% for i in range(3) %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }} {{ ns.y }}")
add("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}")
add("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}")
add("{% set d = {'a': 1} %}{% set d.a = 2 %}")
add("{% set ns = namespace() %}{% set ns.v = 'x' %}{{ ns.v }}{{ ns.missing }}|{{ ns }}")
add("{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
add("{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}")
# macros
add("{% macro f(a, b='B', c=none) %}[{{ a }}|{{ b }}|{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 2, 3) }}{{ f(a=5, c='C') }}{{ f() }}")
add("{% macro f(x) %}{{ x }}{% endmacro %}{{ f(1, 2) }}")
add("{% macro f(x) %}{{ x }}{% endmacro %}{{ f(y=1) }}")
add("{% macro f() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ f(1, 2, k=3) }}")
add("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(5) }}")
add("{% macro outer() %}({{ caller() }}){% endmacro %}{% call outer() %}inside{% endcall %}")
add("{% macro list(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) list([1, 2]) %}<{{ x }}>{% endcall %}")
add("{% set g = 'G' %}{% macro f() %}{{ g }}{% endmacro %}{{ f() }}{% set g = 'H' %}{{ f() }}")
add("{% macro f() %}  x  {% endmacro %}[{{ f()|trim }}]{{ f() is string }}")
add("{% filter upper %}hello {{ 'x' }}{% endfilter %}{% filter replace('a', 'b')|upper %}aaa{% endfilter %}")
# filters
add("{{ [3,1,2]|sort }} {{ [3,1,2]|sort(reverse=true) }} {{ ['b','A','c']|sort }} {{ ['b','A','c']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}")
add("{{ 'Hello World'|lower }} {{ 'hello'|upper }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello world-foo (bar) [baz]'|title }} {{ \"they're bill's\"|title }}")
add("{{ '  x  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ [1, 2, 3]|join(', ') }}|{{ [1, 2]|join }}|{{ [{'a': 'x'}, {'a': 'y'}]|join('-', attribute='a') }}")
add("{{ [1,2,3]|first }} {{ [1,2,3]|last }} {{ []|first }}| {{ 'abc'|first }} {{ {'a': 1, 'b': 2}|first }} {{ {'a': 1, 'b': 2}|last }} {{ 'abc'|length }} {{ {'a': 1}|count }} {{ u|length }}")
add("{{ 'aXbXc'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }} {{ 'abc'|list }} {{ {'a': 1}|list }} {{ {'a': 1, 'b': [2]}|items|list }}")
add("{{ x|tojson }} {{ x|tojson(indent=2) }} {{ x|tojson(sort_keys=true) }} {{ 'é\\n\"<>&'|tojson }} {{ 'é'|tojson(ensure_ascii=true) }} {{ [1, [2, {}], []]|tojson(indent=1) }} {{ x|tojson(separators=(',', ':')) }}", {"x": {"b": 1.5, "a": [1, None, True, "s"], "c": {}}})
add("{{ 1.0|tojson }} {{ 1e20|tojson }} {{ 3|string }} {{ 2.50|string }} {{ [1, 'a']|string }} {{ none|string }} {{ true|string }} {{ u|string }}|")
add("{{ '42'|int }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 4.7|int }} {{ ' 12 '|int }} {{ '0x1A'|int(0, 16) }} {{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }}")
add("{{ -3|abs }} {{ (-3.5)|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }} {{ 3|round }} {{ 1234.5|round(-2) }}")
add("{{ users|map(attribute='name')|join(',') }} {{ ['a', 'b']|map('upper')|list }} {{ users|selectattr('active')|map(attribute='name')|list }} {{ users|rejectattr('active')|list|length }}", {"users": [{"name": "x", "active": True}, {"name": "y", "active": False}]})
add("{{ [1,2,3,4]|select('odd')|list }} {{ [1,2,3,4]|reject('odd')|list }} {{ [0, 1, '', 'a']|select|list }} {{ users|selectattr('n', 'gt', 1)|list }} {{ users|selectattr('n', 'equalto', 1)|list }}", {"users": [{"n": 1}, {"n": 2}]})
add("{{ [1, 2, 1, 3]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} {{ [3,1]|reverse|list }} {{ 'abc'|reverse }} {{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value', reverse=true) }}")
add("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'x'|indent('--', first=true) }}")
add("{{ 'one two  three'|wordcount }} {{ 'ab'|center(6) }}| {{ 'abc'|center(6) }}| {{ '<p>Hello <b>World</b> &amp; more</p>'|striptags }} {{ '<a&\"\\'>'|escape }} {{ '<x>'|e }} {{ '<x>'|safe }}")
add("{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ users|sum(attribute='n') }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ [1,2,3,4,5]|batch(2)|list }} {{ [1,2,3]|batch(2, 0)|list }}", {"users": [{"n": 1}, {"n": 2}]})
add("{{ '%s-%d'|format('a', 3) }} {{ '%05.2f|%x|%r|%%'|format(3.14159, 255, 'q') }} {{ '%s' % 'x' }} {{ '%s and %s' % (1, 2) }} {{ '%(a)s' % {'a': 'A'} }}")
add("{{ 'hello world foo bar baz'|truncate(9) }}|{{ 'hello world foo bar baz'|truncate(9, true) }}|{{ 'hello'|truncate(3, leeway=0) }}")
add("{{ x|attr('a') }}|{{ ns|attr('v') }}", {"x": {"a": 1}})
add("{{ x|items }}")
add("{{ 1|items }}")
add("{{ u|tojson }}")
add("{{ x|nosuchfilter }}")
add("{{ x is nosuchtest }}")
# methods
add("{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ '  a b  '.strip() }}|{{ 'xxaxx'.strip('x') }} {{ '\\n\\nab\\n'.lstrip('\\n') }}|{{ 'ab\\n '.rstrip('\\n') }}|{{ 'ab  '.rstrip() }}|")
add("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ '  a b  c  '.split(none, 1) }} {{ '  a b  c  '.rsplit(none, 1) }} {{ 'x'.split('x') }}")
add("{{ 'a\\nb\\r\\nc\\rd'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ ''.splitlines() }}")
add("{{ 'aaa'.replace('a', 'b') }} {{ 'hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello world'.title() }} {{ \"they're\".title() }} {{ 'hELLo'.capitalize() }}")
add("{{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} {{ 'hello'.find('z') }} {{ 'héllo'.find('l') }} {{ 'hello'.count('l') }} {{ '-'.join(['a', 'b']) }} {{ ', '.join('abc') }}")
add("{{ '{} and {}'.format(1, 'b') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x=5) }} {{ '{:>5}|{:<4}|{:^5}|{:05d}|{:.2f}|{!r}'.format('a', 'b', 'c', 42, 3.14159, 'q') }} {{ '{{}}'.format() }}")
add("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'def') }} {{ d.keys() }} {{ d.values() }} {{ d.items() }} {{ [1, 2, 1].count(1) }} {{ [1, 2].index(2) }}", {"d": {"a": 1, "b": 2}})
add("{{ 'abc'.isalpha() }} {{ '123'.isdigit() }} {{ ' \\t'.isspace() }} {{ 'ab1'.isalnum() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ '42'.zfill(5) }} {{ 'a=b=c'.partition('=') }} {{ 'prefix_x'.removeprefix('prefix_') }}")
add("{{ 'ÉCOLE'.lower() }} {{ 'straße'.upper() }} {{ 'привет'.upper() }} {{ 'ǅ'.lower() }}")
add("{{ x.append(1) }}", {"x": [1]})
add("{{ x.update({'a': 1}) }}", {"x": {}})
add("{{ 'a'.nosuchmethod() }}")
add("{{ range(3)|list }} {{ range(1, 10, 3)|list }} {{ range(5, 0, -2)|list }} {{ range(0)|list }} {{ range(3, 1)|list }}")
add("{{ range(1000000)|length }}")
add("{{ dict(a=1, b=2) }} {{ dict({'x': 1}, y=2) }}")
add("{{ raise_exception('boom') }}")
add("{% set j = joiner(', ') %}{% for x in 'abc' %}{{ j() }}{{ x }}{% endfor %}")
# syntax errors
add("{% if x %}")
add("{% for x in y %}{% endif %}")
add("{{ 1 + }}")
add("{% endif %}")
add("{{ 'unterminated }}")
add("{# unterminated comment")
add("{% foo %}")
add("{{ x | }}")
add("{% break %}")
add("{{ (1, 2 }}")
add("{{ [1, 2) }}")
add("{% set %}")
add("{% macro f(a=1, b) %}{% endmacro %}")
add("{% include 'x' %}")
add("{{ x }", {"x": 1})
add("{{ {'a': {'b': 1}} }} {{ {'a': {'b': 1}}['a'] }}")
add("{% if 1 %}a{% elif 2 %}b{% else %}c{% endif %}{% if 0 %}a{% elif 2 %}b{% else %}c{% endif %}{% if 0 %}a{% elif 0 %}b{% else %}c{% endif %}")
add("{% generation %}gen{% endgeneration %}")
add("{{ x is string and x.startswith('a') }}", {"x": 5})
add("{{ messages|length }} {{ tools is none }} {{ add_generation_prompt }}")

# Jinja2's static scoping (see src/chat/jinja_scopes.cpp); the context has n = 3.
add("{% if false %}{% set n = 1 %}{% endif %}[{{ n }}]", {"n": 3})
add("[{{ n }}]{% if false %}{% set n = 1 %}{% endif %}[{{ n }}]", {"n": 3})
add("{% for i in [1,2] %}{% if i == 2 %}{% set n = 1 %}{% endif %}[{{ n }}]{% endfor %}[{{ n }}]", {"n": 3})
add("{% for i in [1,2] %}[{{ n }}]{% if i == 2 %}{% set n = 1 %}{% endif %}[{{ n }}]{% endfor %}", {"n": 3})
add("{% for i in [1,2,3] %}{% if i == 2 %}{% set n = i %}{% endif %}[{{ n }}]{% endfor %}", {"n": 3})
add("{% macro f() %}{% if false %}{% set n = 1 %}{% endif %}[{{ n }}]{% endmacro %}{{ f() }}", {"n": 3})
add("{% set n = 5 %}{% for i in [1,2] %}{% if i == 2 %}{% set n = 1 %}{% endif %}[{{ n }}]{% endfor %}[{{ n }}]", {"n": 3})
add("{% for i in [1,2] %}{% for j in [1] %}[{{ n }}]{% endfor %}{% set n = i %}{% endfor %}", {"n": 3})
add("{% for i in [1,2] %}{% set n = n + 1 %}[{{ n }}]{% endfor %}", {"n": 3})
add("{% if true %}{% set n = n + 1 %}{% endif %}[{{ n }}]", {"n": 3})
add("{% for i in [1,2] %}{% if false %}{% set n = 1 %}{% endif %}{% for j in [1] %}[{{ n }}]{% endfor %}{% endfor %}", {"n": 3})
add("{% for i in [1] %}[{{ n }}]{% endfor %}{% set n = 1 %}[{{ n }}]", {"n": 3})
add("{% macro f() %}[{{ n }}]{% endmacro %}{{ f() }}{% set n = 1 %}{{ f() }}", {"n": 3})
add("{% set x %}{% set y = 1 %}{{ y }}{% endset %}[{{ x }}][{{ y }}]", {"n": 3})
add("{% for i in [] %}{% else %}{% set z = 1 %}{% endfor %}[{{ z }}]", {"n": 3})
add("{% for i in [1] %}{% set m = 2 %}{% endfor %}[{{ m }}]", {"n": 3})
add("{% set k = 1 %}{% macro f() %}{% set k = k + 1 %}[{{ k }}]{% endmacro %}{{ f() }}{{ f() }}[{{ k }}]", {"n": 3})
add("{% macro f() %}{% set n = 7 %}{% for i in [1] %}[{{ n }}]{% endfor %}{% endmacro %}{{ f() }}", {"n": 3})
add("{% for i in [1, 2] %}{% set n = loop.index %}{% for j in [1] %}[{{ n }}]{% endfor %}{% endfor %}", {"n": 3})
add("{% with a = n %}{% set n = 9 %}[{{ a }}{{ n }}]{% endwith %}[{{ n }}]", {"n": 3})
add("{% filter upper %}{% set q = 'x' %}{{ q }}{% endfilter %}[{{ q }}]", {"n": 3})
add("{% if true %}{% set n = 1 %}{% else %}{% set n = 2 %}{% endif %}[{{ n }}]", {"n": 3})
add("{% for i in [1,2] %}{% if i == 1 %}{% set n = 10 %}{% else %}[{{ n }}]{% endif %}{% endfor %}", {"n": 3})
add("{% for i in [1,2] %}[{{ n }}]{% set n = 10 %}{% endfor %}", {"n": 3})
add("{% for i in [1] %}{% set ns = namespace(a=1) %}{% set ns.a = n %}[{{ ns.a }}]{% endfor %}", {"n": 3})
add("{% for i in [1,2] %}{% if i == 1 %}{% set n = 1 %}{% elif i == 2 %}{% set p = n %}[{{ p }}]{% endif %}{% endfor %}", {"n": 3})
# Slices are plain Python subscripts (they raise on other types); indent/truncate need a str.
add("{{ x[1:] }}", {"x": 5})
add("{{ x[::-1] }}", {"x": {"a": 1}})
add("{{ x|indent(2) }}", {"x": 5})
add("{{ x|truncate(5) }}", {"x": 5})
add("{{ [1, 2]|truncate(5) }}|{{ 'abcdefghijk'|truncate(5, leeway=0) }}")

SKIP = ["x.items }}", "x|items }}", "1|items", "d.keys()", "generation"]
out = []
for src, ctx in C:
    if any(s in src for s in SKIP):
        continue
    case = {"template": src, "context": ctx}
    try:
        case["output"] = env.from_string(src).render(messages=[], tools=None, add_generation_prompt=False, **ctx)
    except Exception as e:  # noqa: BLE001 - every Jinja2 failure is an expected error case
        case["error"] = f"{type(e).__name__}: {e}"
    out.append(case)
print(json.dumps({"producer": f"jinja2 {jinja2.__version__}", "cases": out}, ensure_ascii=False, indent=1))
