// The build's version, source sha and build identity (from CMake's configure step), recorded in every results file.
#pragma once

namespace fb {
const char *version();
const char *git_sha(); // "unknown" outside a git checkout; "-dirty" when tracked files had changes
// What besides the source decides the generated code: build type, CUDA architectures, optional features and the
// flags given at configure time ("type=Release;cuda_arch=90-real;cupti=ON;cxx_flags=;cuda_flags=").
const char *build_options();
// The compilers: "nvcc 13.0.88; GNU 13.3.0".
const char *toolkit();
} // namespace fb
