#include "flashbench/check.hpp"

#include <sstream>

namespace fb {

bool CudaError::sticky() const {
  // These leave the context unusable: every later call in this process fails with the same error.
  switch (code_) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorAssert:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorLaunchTimeout:
  case cudaErrorECCUncorrectable:
    return true;
  default:
    return false;
  }
}

void throw_cuda_error(cudaError_t code, const char *expr, const char *file, int line) {
  std::ostringstream os;
  os << "CUDA error " << cudaGetErrorName(code) << " (" << cudaGetErrorString(code) << ") in "
     << expr << " at " << file << ":" << line;
  throw CudaError(os.str(), code);
}

void throw_library_error(const char *library, int code, const char *detail, const char *expr,
                         const char *file, int line) {
  std::ostringstream os;
  os << library << " error " << code << " (" << (detail ? detail : "no detail") << ") in " << expr
     << " at " << file << ":" << line;
  throw std::runtime_error(os.str());
}

} // namespace fb
