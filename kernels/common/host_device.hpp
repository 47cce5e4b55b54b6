// FB_HOST_DEVICE: for helpers used from host-only translation units (traffic models, tests) as
// well as from device code.
#pragma once

#ifdef __CUDACC__
#define FB_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FB_HOST_DEVICE inline
#endif
