// The test-only variant's fault kinds and launch entry point (test_faults.cu).
#pragma once

#include <cuda_runtime_api.h>

namespace fb::test_faults {

enum class Fault { none = 0, illegal_access = 1, trap = 2, spin = 3 };

// Enqueues the faulty kernel of kind f (nothing for none).
void launch_fault(Fault f, cudaStream_t stream);

} // namespace fb::test_faults
