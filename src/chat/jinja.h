// A Jinja template engine for chat templates: the subset of Jinja2 that Hugging Face chat
// templates use, rendered as transformers renders them (trim_blocks, lstrip_blocks, Jinja2's
// default Undefined, its own tojson, raise_exception and strftime_now globals).
//
//   jinja::Template t(source, "chat_template.jinja");   // throws lilac::Error on a syntax error
//   std::string out = t.render(context);                 // context: a dict Value of variables
//
// Errors (syntax, raise_exception, type errors, resource bounds) are lilac::Error whose message
// names the template and the line. A Template is immutable and may render from several threads.
#pragma once

#include <memory>
#include <string>

#include "chat/jinja_lexer.h"
#include "chat/jinja_value.h"

namespace lilac::jinja {

struct Program;

class Template {
 public:
  Template(const std::string& source, std::string name, const LexOptions& options = {});
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  std::string render(const Value& context) const;
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::unique_ptr<Program> program_;
};

}  // namespace lilac::jinja
