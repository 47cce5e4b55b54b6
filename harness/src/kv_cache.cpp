#include "flashbench/kv_cache.hpp"

#include "flashbench/check.hpp"

#include <algorithm>
#include <utility>

namespace fb {

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::vector<int32_t> shuffled_page_table(const AttentionProblem &p, uint64_t seed) {
  if (!p.paged())
    return {};
  const int64_t n = p.num_pages();
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j =
        static_cast<int64_t>(mix(seed ^ (static_cast<uint64_t>(i) * 0x2545f4914f6cdd1dull)) %
                             static_cast<uint64_t>(i + 1));
    std::swap(t[static_cast<size_t>(i)], t[static_cast<size_t>(j)]);
  }
  return t;
}

KvCacheBuffers build_kv_cache(const AttentionProblem &p, const void *k, const void *v,
                              uint64_t seed, cudaStream_t stream) {
  KvCacheBuffers out;
  std::vector<int32_t> lens(static_cast<size_t>(p.batch));
  for (int64_t b = 0; b < p.batch; ++b)
    lens[static_cast<size_t>(b)] = static_cast<int32_t>(p.kv_len(b));
  out.seqlens = DeviceBuffer(lens.size() * sizeof(int32_t));
  FB_CUDA_CHECK(cudaMemcpyAsync(out.seqlens.get(), lens.data(), lens.size() * sizeof(int32_t),
                                cudaMemcpyHostToDevice, stream));
  if (p.paged()) {
    const std::vector<int32_t> table = shuffled_page_table(p, seed);
    out.page_table = DeviceBuffer(table.size() * sizeof(int32_t));
    FB_CUDA_CHECK(cudaMemcpyAsync(out.page_table.get(), table.data(),
                                  table.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    const size_t e = static_cast<size_t>(dtype_bytes(p.dtype));
    const size_t row =
        static_cast<size_t>(p.heads_kv * p.head_dim) * e; // one token of one entry (bshd)
    const size_t pool = static_cast<size_t>(p.kv_storage_elems()) * e;
    out.k_pages = DeviceBuffer(pool);
    out.v_pages = DeviceBuffer(pool);
    poison(out.k_pages.get(), pool, stream);
    poison(out.v_pages.get(), pool, stream);
    const Strides ks = p.kv_strides();
    const int64_t pps = p.pages_per_seq();
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t j = 0; j < pps; ++j) {
        const int64_t t0 = j * p.page_size;
        const size_t rows = static_cast<size_t>(std::min(p.page_size, p.seqlen_kv - t0));
        const size_t src = static_cast<size_t>(b * ks.batch + t0 * ks.seq) * e;
        const size_t dst = static_cast<size_t>(table[static_cast<size_t>(b * pps + j)]) *
                           static_cast<size_t>(p.page_size) * row;
        FB_CUDA_CHECK(cudaMemcpyAsync(static_cast<char *>(out.k_pages.get()) + dst,
                                      static_cast<const char *>(k) + src, rows * row,
                                      cudaMemcpyDeviceToDevice, stream));
        FB_CUDA_CHECK(cudaMemcpyAsync(static_cast<char *>(out.v_pages.get()) + dst,
                                      static_cast<const char *>(v) + src, rows * row,
                                      cudaMemcpyDeviceToDevice, stream));
      }
  }
  FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

} // namespace fb
