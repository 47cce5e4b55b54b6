// The device-side extras of decode-style problems: each entry's KV length (cache_seqlens) and, for a paged
// cache, a page table and the K/V page pools, built from the contiguous K/V that the references read.
#pragma once

#include "flashbench/buffers.hpp"
#include "flashbench/problem.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace fb {

// A shuffled page table [batch, pages_per_seq]: a permutation of the pool's pages (Fisher-Yates over
// splitmix64(seed)), so that consecutive logical pages are never neighbours by construction and a kernel that
// ignores the table fails. Empty when the problem is not paged.
std::vector<int32_t> shuffled_page_table(const AttentionProblem &p, uint64_t seed);

struct KvCacheBuffers {
  DeviceBuffer seqlens;          // int32 [batch]: kv_len(b), always set
  DeviceBuffer page_table;       // int32 [batch, pages_per_seq]; paged problems only
  DeviceBuffer k_pages, v_pages; // [num_pages, page_size, heads_kv, head_dim]; paged problems only
};

// k and v are the contiguous (bshd) tensors. The pools' rows past seqlen_kv (the last page's tail) are NaN, so
// a kernel that reads past an entry's length shows it. Synchronises the stream.
KvCacheBuffers build_kv_cache(const AttentionProblem &p, const void *k, const void *v,
                              uint64_t seed, cudaStream_t stream);

} // namespace fb
