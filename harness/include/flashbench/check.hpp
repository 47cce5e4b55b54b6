// The one error-check header. Every CUDA, cuBLAS and CUPTI call goes through these macros so that a failure
// carries file:line and the API's own message. They throw (never exit) so that the sweep engine can record the
// point as crashed and go on.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace fb {

// A CUDA runtime error. `sticky` is true for errors that poison the context (illegal address, trap, launch
// failure): after one of those no further work can run in this process.
class CudaError : public std::runtime_error {
public:
  CudaError(const std::string &what, cudaError_t code) : std::runtime_error(what), code_(code) {}
  cudaError_t code() const { return code_; }
  bool sticky() const;

private:
  cudaError_t code_;
};

[[noreturn]] void throw_cuda_error(cudaError_t code, const char *expr, const char *file, int line);
[[noreturn]] void throw_library_error(const char *library, int code, const char *detail,
                                      const char *expr, const char *file, int line);

} // namespace fb

#define FB_CUDA_CHECK(expr)                                                                        \
  do {                                                                                             \
    cudaError_t fb_status_ = (expr);                                                               \
    if (fb_status_ != cudaSuccess)                                                                 \
      ::fb::throw_cuda_error(fb_status_, #expr, __FILE__, __LINE__);                               \
  } while (0)

// After a kernel launch: catches bad launch configurations at once (no device sync, so it is safe on timed paths).
#define FB_CHECK_LAUNCH() FB_CUDA_CHECK(cudaGetLastError())

// cuBLAS: include <cublas_v2.h> before using this.
#define FB_CUBLAS_CHECK(expr)                                                                      \
  do {                                                                                             \
    auto fb_status_ = (expr);                                                                      \
    if (fb_status_ != CUBLAS_STATUS_SUCCESS)                                                       \
      ::fb::throw_library_error("cuBLAS", static_cast<int>(fb_status_),                            \
                                cublasGetStatusString(fb_status_), #expr, __FILE__, __LINE__);     \
  } while (0)

// CUPTI: include <cupti.h> before using this.
#define FB_CUPTI_CHECK(expr)                                                                       \
  do {                                                                                             \
    CUptiResult fb_status_ = (expr);                                                               \
    if (fb_status_ != CUPTI_SUCCESS) {                                                             \
      const char *fb_msg_ = nullptr;                                                               \
      cuptiGetResultString(fb_status_, &fb_msg_);                                                  \
      ::fb::throw_library_error("CUPTI", static_cast<int>(fb_status_), fb_msg_, #expr, __FILE__,   \
                                __LINE__);                                                         \
    }                                                                                              \
  } while (0)
