// User-facing errors. A UserError is the user's to fix (bad spec, unknown variant, impossible shape): the CLI prints
// its message as one line and exits with code 2, before any output file is created.
#pragma once

#include <stdexcept>
#include <string>

namespace fb {

class UserError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

constexpr int kExitUserError = 2;

} // namespace fb
