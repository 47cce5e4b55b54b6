// FastDiv against the hardware division: every divisor up to 4096 and a spread of larger ones, each
// with the numerators where a multiply-high scheme goes wrong first (multiples of d and their
// neighbours, powers of two, the top of the supported range 2^31 - 1).
#include "kernels/common/fast_div.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

using fb::kernels::FastDiv;

namespace {
void check(uint32_t d, uint32_t n) {
  const FastDiv f(d);
  ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  ASSERT_EQ(f.mod(n), n % d) << n << " % " << d;
}
} // namespace

TEST(FastDiv, MatchesDivisionOverTheSupportedRange) {
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d)
    divisors.push_back(d);
  std::mt19937 rng(1234);
  for (int i = 0; i < 2000; ++i)
    divisors.push_back(1 + rng() % 0x7fffffffu);
  for (uint32_t s = 12; s < 31; ++s)
    for (uint32_t d : {(1u << s) - 1, 1u << s, (1u << s) + 1})
      divisors.push_back(d);
  const uint32_t top = 0x7fffffffu;
  for (const uint32_t d : divisors) {
    for (uint32_t n = 0; n < 64; ++n)
      check(d, n);
    for (const int64_t k : {int64_t(1), int64_t(2), int64_t(3), int64_t(7), int64_t(1000),
                            int64_t(top / d) - 1, int64_t(top / d)})
      for (int64_t e = -1; e <= 1; ++e) {
        const int64_t n = k * int64_t(d) + e;
        if (n >= 0 && n <= top)
          check(d, uint32_t(n));
      }
    for (uint32_t s = 0; s < 31; ++s)
      check(d, 1u << s);
    check(d, top);
    for (int i = 0; i < 16; ++i)
      check(d, rng() & top);
  }
}
