// Stop strings over streamed text: text is released only once it cannot be the start of a stop
// string; when a stop string completes, the text before it is released and generation ends.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lilac {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends text; returns what can be released now. Sets stopped() when a stop string appeared
  // (the stop string and anything after it are dropped).
  std::string push(std::string_view text);
  // End of generation: everything held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace lilac
