// A generated corpus of JSON schemas for the structured-output tests: nested objects, arrays
// (items, prefixItems, min/maxItems), enums, consts, unions (anyOf, disjoint oneOf, type arrays),
// $ref / $defs, string lengths, patterns and formats, integer and number bounds. Seeded, so the
// corpus is the same on every run. Every schema bounds what it allows (strings have a maxLength,
// a pattern or a format; arrays a maxItems; no free-form objects), so the demo model's random
// output always ends within max_tokens, and a truncated answer is a failure, not an excuse.

// mulberry32: a small seeded PRNG.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PATTERNS = [
  '^[a-z]{2,5}$', '^[A-Z][0-9]{3}$', '^(foo|bar|baz)-[0-9]{1,3}$', '^\\d{3}-\\d{4}$',
  '^[a-f0-9]{6}$', '^(?:yes|no)$', '^v[0-9]\\.[0-9]{1,2}$', '^[A-Z]{2}[a-z]?$', '^#[0-9A-F]{3}$',
];
const FORMATS = ['date', 'time', 'date-time', 'uuid', 'email'];
const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'red', 'green', 'blue', 'x', 'y', 'z', 'ünïcode', 'a"quote', 'back\\slash'];

export function generateSchema(seed) {
  const r = rng(seed);
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const pick = (xs) => xs[int(0, xs.length - 1)];
  const defs = {};
  let nDefs = 0;

  function leaf() {
    switch (int(0, 11)) {
      case 0: return { type: 'string', maxLength: int(1, 8) };
      case 1: return { type: 'string', minLength: int(1, 3), maxLength: int(3, 8) };
      case 2: return { enum: Array.from(new Set([pick(WORDS), pick(WORDS), pick(WORDS)])) };
      case 3: return { type: 'string', pattern: pick(PATTERNS) };
      case 4: return { type: 'string', format: pick(FORMATS) };
      case 5: { const lo = int(-1000, 100); return { type: 'integer', minimum: lo, maximum: lo + int(0, 5000) }; }
      case 6: return { type: 'integer', exclusiveMinimum: int(-50, 0), exclusiveMaximum: int(10, 99) };
      case 7: { const lo = int(-100, 10) + 0.5; return { type: 'number', minimum: lo, maximum: lo + int(1, 300) }; }
      case 8: return { type: 'boolean' };
      case 9: return { const: pick([42, 'fixed', true, null, [1, 2], { k: 'v' }]) };
      case 10: return { type: ['string', 'null'], maxLength: int(1, 6) };
      default: return { enum: [int(0, 9), pick(WORDS), null] };
    }
  }

  function node(depth) {
    const k = depth >= 3 ? 0 : int(0, 9);
    if (k <= 3) return leaf();
    if (k <= 5) return object(depth);
    if (k === 6) return array(depth);
    if (k === 7) return { anyOf: [node(depth + 1), node(depth + 1)] };
    if (k === 8) {  // oneOf with branches of different JSON types
      return { oneOf: [{ type: 'string', maxLength: int(1, 5) }, { type: 'integer', minimum: 0, maximum: int(1, 999) }, { type: 'boolean' }].slice(0, int(2, 3)) };
    }
    const name = `def${nDefs++}`;
    defs[name] = depth < 2 && r() < 0.5 ? object(depth + 1) : leaf();
    return { $ref: `#/$defs/${name}` };
  }

  function object(depth) {
    const n = int(1, 4);
    const properties = {};
    const required = [];
    for (let i = 0; i < n; i++) {
      const key = pick(['id', 'name', 'value', 'items', 'kind', 'when', 'score', 'note', 'ok']) + (i || '');
      properties[key] = node(depth + 1);
      if (r() < 0.6) required.push(key);
    }
    return { type: 'object', properties, required, additionalProperties: false };
  }

  function array(depth) {
    if (r() < 0.3) {
      const prefixItems = [node(depth + 1), node(depth + 1)];
      return { type: 'array', prefixItems, items: false, minItems: int(0, 2) };
    }
    const maxItems = int(1, 3);
    return { type: 'array', items: node(depth + 1), minItems: int(0, maxItems), maxItems };
  }

  const root = r() < 0.8 ? object(0) : node(0);
  if (nDefs) root.$defs = defs;
  return root;
}
