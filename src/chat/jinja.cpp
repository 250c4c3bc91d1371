#include "chat/jinja.h"

#include "chat/jinja_eval.h"
#include "chat/jinja_parser.h"

namespace lilac::jinja {

Template::Template(const std::string& source, std::string name, const LexOptions& options)
    : name_(std::move(name)), program_(parse(tokenize(source, name_, options), name_)) {}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  if (!context.is_dict()) fail("{}: the render context must be a dict", name_);
  return Evaluator(*program_, context).run();
}

}  // namespace lilac::jinja
