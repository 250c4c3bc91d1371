// The engine's version and the git commit it was built from (generated at configure time into
// the build tree, so a new commit recompiles one file, not the whole project).
#pragma once

namespace lilac {

const char* version();     // "0.1.0"
const char* git_commit();  // short hash, or "unknown"

}  // namespace lilac
