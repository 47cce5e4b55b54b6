// The build's version and git sha (from CMake's configure step), recorded in every results file.
#pragma once

namespace fb {
const char* version();
const char* git_sha(); // "unknown" outside a git checkout; "-dirty" when tracked files had changes
} // namespace fb
