// Python string formatting for templates: str.format ('{} {name!r:>8}'.format(...)) and the %
// operator ('%s-%05.2f' % (a, b), also Jinja's `format` filter). The common conversions are
// covered; anything else is a clear error rather than a silent difference from Python.
#include <algorithm>

#include "chat/jinja_eval.h"
#include "chat/jinja_text.h"

namespace lilac::jinja {

namespace {

// Applies a str.format spec [[fill]align][sign][0][width][.precision][type] to one value.
std::string apply_spec(const Value& v, const std::string& spec) {
  size_t i = 0;
  std::string fill = " ";
  char align = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = spec.substr(0, 1);
    align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    align = spec[0];
    i = 1;
  }
  char sign = 0;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  if (i < spec.size() && spec[i] == '0') {
    if (!align) {
      fill = "0";
      align = '=';
    }
    ++i;
  }
  int64_t width = 0, prec = -1;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
    width = std::min<int64_t>(width * 10 + (spec[i++] - '0'), 100000);
  if (i < spec.size() && spec[i] == '.') {
    prec = 0;
    ++i;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9')
      prec = std::min<int64_t>(prec * 10 + (spec[i++] - '0'), 300);
  }
  char type = i < spec.size() ? spec[i++] : 0;
  if (i != spec.size()) fail("invalid format specifier '{}'", spec);
  std::string body;
  char buf[512];
  if (type == 0 && !v.is_number()) type = 's';
  if (type == 's') {
    if (v.is_number() && !v.is_bool())
      fail("unknown format code 's' for object of type '{}'", v.type_name());
    body = v.to_str();
    if (prec >= 0)
      body = body.substr(
          0,
          text::cp_offsets(body)[size_t(std::min<int64_t>(prec, int64_t(text::cp_length(body))))]);
    if (!align) align = '<';
  } else {
    if (!v.is_number())
      fail("unknown format code '{}' for object of type '{}'", type, v.type_name());
    std::string f = "%";
    if (sign == '+' || sign == ' ') f += sign;
    if (type == 0) {
      body = v.is_float() ? (prec >= 0 ? (std::snprintf(buf, sizeof buf, (f + ".*g").c_str(),
                                                        int(prec), v.as_double()),
                                          std::string(buf))
                                       : float_repr(v.as_double()))
                          : std::to_string(v.as_int());
      if (sign == '+' && body[0] != '-') body = "+" + body;
    } else if (type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b') {
      if (v.is_float()) fail("unknown format code '{}' for object of type 'float'", type);
      if (type == 'b') {
        uint64_t u = v.as_int() < 0 ? uint64_t(-(v.as_int() + 1)) + 1 : uint64_t(v.as_int());
        do body.insert(body.begin(), char('0' + (u & 1)));
        while (u >>= 1);
        if (v.as_int() < 0) body = "-" + body;
      } else {
        std::snprintf(buf, sizeof buf, (f + "ll" + type).c_str(), (long long)v.as_int());
        body = buf;
      }
    } else if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' ||
               type == 'G' || type == '%') {
      double d = v.as_double() * (type == '%' ? 100 : 1);
      std::snprintf(buf, sizeof buf, (f + ".*" + (type == '%' ? 'f' : type)).c_str(),
                    int(prec < 0 ? 6 : prec), d);
      body = std::string(buf) + (type == '%' ? "%" : "");
    } else {
      fail("unknown format code '{}'", type);
    }
    if (!align) align = '>';
  }
  int64_t len = int64_t(text::cp_length(body));
  if (width <= len) return body;
  int64_t pad = width - len;
  auto rep = [&](int64_t n) {
    std::string s;
    for (int64_t k = 0; k < n; ++k) s += fill;
    return s;
  };
  if (align == '<') return body + rep(pad);
  if (align == '^') return rep(pad / 2) + body + rep(pad - pad / 2);
  if (align == '=' && !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' '))
    return body.substr(0, 1) + rep(pad) + body.substr(1);
  return rep(pad) + body;
}

}  // namespace

std::string str_format(Evaluator& ev, const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        fail("Single '}}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t e = fmt.find('}', i);
    if (e == std::string::npos) fail("Single '{{' encountered in format string");
    std::string field = fmt.substr(i + 1, e - i - 1), spec, conv;
    i = e;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conv = field.substr(bang + 1);
      field.resize(bang);
    }
    size_t end = field.find_first_of(".[");
    std::string head = field.substr(0, end);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.pos.size())
        fail("Replacement index {} out of range for positional args tuple", auto_index);
      v = args.pos[auto_index++];
    } else if (std::all_of(head.begin(), head.end(),
                           [](char ch) { return ch >= '0' && ch <= '9'; })) {
      size_t k = std::stoul(head);
      if (k >= args.pos.size())
        fail("Replacement index {} out of range for positional args tuple", k);
      v = args.pos[k];
    } else {
      auto it = std::find_if(args.kw.begin(), args.kw.end(),
                             [&](const auto& kv) { return kv.first == head; });
      if (it == args.kw.end()) fail("KeyError: '{}'", head);
      v = it->second;
    }
    for (size_t p = end; p != std::string::npos && p < field.size();) {
      if (field[p] == '.') {
        size_t q = field.find_first_of(".[", p + 1);
        v = ev.get_attr(
            v, field.substr(p + 1, q == std::string::npos ? std::string::npos : q - p - 1));
        p = q;
      } else {
        size_t q = field.find(']', p);
        if (q == std::string::npos) fail("Missing ']' in format string");
        std::string key = field.substr(p + 1, q - p - 1);
        bool digits = !key.empty() && std::all_of(key.begin(), key.end(),
                                                  [](char ch) { return ch >= '0' && ch <= '9'; });
        v = ev.get_item(v, digits ? Value(int64_t(std::stoll(key))) : Value(key));
        p = q + 1;
      }
    }
    if (conv == "r" || conv == "a")
      v = Value(v.repr());
    else if (conv == "s")
      v = Value(v.to_str());
    else if (!conv.empty())
      fail("Unknown conversion specifier {}", conv);
    out += apply_spec(v, spec);
    check_size(out.size());
  }
  return out;
}

std::string percent_format(const std::string& fmt, const Value& args) {
  List pos = args.kind() == Value::Kind::Tuple ? args.items() : List{args};
  const Dict* named = args.is_dict() ? &args.dict() : nullptr;
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      size_t e = fmt.find(')', i);
      if (e == std::string::npos || !named) fail("format requires a mapping");
      arg = named->find(std::string_view(fmt).substr(i + 1, e - i - 1));
      if (!arg) fail("format key {} not found", fmt.substr(i + 1, e - i - 1));
      i = e + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos)
      spec += fmt[i++];
    while (i < fmt.size() && ((fmt[i] >= '0' && fmt[i] <= '9') || fmt[i] == '.')) spec += fmt[i++];
    if (i >= fmt.size()) fail("incomplete format");
    char type = fmt[i];
    if (type == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (named && pos.size() == 1 && pos[0].is_dict()) fail("format requires a mapping key");
      if (next >= pos.size()) fail("not enough arguments for format string");
      arg = &pos[next++];
    }
    char buf[512];
    std::string body;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        body = type == 's' ? arg->to_str() : arg->repr();
        spec += "s";
        if (spec == "%s") {
          out += body;
          continue;
        }
        std::snprintf(buf, sizeof buf, spec.c_str(), body.c_str());
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
      case 'c':
        if (!arg->is_number())
          fail("%{} format: a real number is required, not {}", type, arg->type_name());
        if (type == 'c') {
          text::append_cp(out, uint32_t(arg->as_int()));
          continue;
        }
        spec += "ll";
        spec += type == 'i' ? 'd' : type;
        std::snprintf(buf, sizeof buf, spec.c_str(),
                      (long long)(arg->is_float() ? int64_t(arg->as_double()) : arg->as_int()));
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg->is_number()) fail("must be real number, not {}", arg->type_name());
        spec += type;
        std::snprintf(buf, sizeof buf, spec.c_str(), arg->as_double());
        break;
      default:
        fail("unsupported format character '{}'", type);
    }
    out += buf;
  }
  if (!named && next < pos.size()) fail("not all arguments converted during string formatting");
  return out;
}

}  // namespace lilac::jinja
