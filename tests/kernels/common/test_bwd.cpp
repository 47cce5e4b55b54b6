// kernels/common/bwd.hpp: the rotated row order's starts and ranks, against the order in which the column blocks
// reach each row block when all run at one speed; the launch orders of the column blocks.
#include "kernels/common/bwd.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

using fb::AttentionProblem;
using namespace fb::kernels::bwd;

TEST(BwdRotatedOrder, RanksAreTheArrivalOrderOfEveryRowBlock) {
  for (int rows : {1, 2, 3, 7, 16, 64, 257})
    for (int cols : {1, 2, 3, 8, 12, 64, 128, 300}) {
      for (int n = 1; n < cols; ++n)
        ASSERT_LE(rotated_start(n - 1, rows, cols), rotated_start(n, rows, cols));
      for (int m = 0; m < rows; ++m) {
        // Column n reaches row block m after (m - start) mod R steps; ties go to the higher n first.
        std::vector<int> order(static_cast<size_t>(cols));
        std::iota(order.begin(), order.end(), 0);
        const auto steps = [&](int n) { return (m - rotated_start(n, rows, cols) + rows) % rows; };
        std::sort(order.begin(), order.end(),
                  [&](int x, int y) { return steps(x) != steps(y) ? steps(x) < steps(y) : x > y; });
        for (int r = 0; r < cols; ++r)
          ASSERT_EQ(rotated_rank(order[static_cast<size_t>(r)], m, rows, cols), r)
              << "rows " << rows << " cols " << cols << " row block " << m;
      }
    }
}

TEST(BwdRotatedOrder, StartsSpreadOverTheRowBlocks) {
  EXPECT_EQ(rotated_start(0, 16, 8), 0);
  EXPECT_EQ(rotated_start(1, 16, 8), 2);
  EXPECT_EQ(rotated_start(7, 16, 8), 14);
  EXPECT_EQ(rotated_start(5, 2, 12), 0); // more columns than rows: several share a start
  EXPECT_EQ(rotated_start(6, 2, 12), 1);
}

// kernels/common/bwd.hpp: the launch orders of the column blocks (grid_order) and the sections of the L2.
constexpr int kOrders[][2] = {{kOrderNatural, 0}, // (order, deterministic)
                              {kOrderLpt, 0},
                              {kOrderSections, 0},
                              {kOrderNatural, 1}};

TEST(BwdGridOrder, GridOrderIsABijection) {
  for (auto [cols, bhs] :
       {std::pair<int64_t, int64_t>{1, 1}, {1, 7}, {5, 1}, {3, 4}, {16, 12}, {7, 33}})
    for (const auto &o : kOrders)
      for (int64_t sections : {int64_t(1), int64_t(2), int64_t(5), bhs}) {
        if (sections > bhs)
          continue;
        std::vector<int> seen(static_cast<size_t>(cols * bhs), 0);
        for (int64_t x = 0; x < cols * bhs; ++x) {
          const GridSlot s = grid_order(x, cols, bhs, o[0], o[1] != 0, sections);
          ASSERT_TRUE(s.col >= 0 && s.col < cols && s.bh >= 0 && s.bh < bhs)
              << "x " << x << " cols " << cols << " bh " << bhs << " order " << o[0];
          ++seen[static_cast<size_t>(s.bh * cols + s.col)];
        }
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }))
            << "cols " << cols << " bh " << bhs << " order " << o[0] << " det " << o[1]
            << " sections " << sections;
      }
}

TEST(BwdGridOrder, SectionsRunLptInsideConsecutiveRunsOfHeads) {
  // Each section is a run of consecutive (batch, kv head) pairs, the larger sections first and sizes differing by
  // at most one; inside a section every pair's first column block comes before any pair's second.
  for (auto [cols, bhs, sections] : {std::tuple<int64_t, int64_t, int64_t>{16, 128, 11},
                                     {8, 256, 8},
                                     {128, 16, 16},
                                     {5, 7, 3},
                                     {3, 10, 4},
                                     {4, 6, 1}}) {
    const int64_t small = bhs / sections, big = bhs % sections;
    int64_t x = 0;
    for (int64_t sec = 0; sec < sections; ++sec) {
      const int64_t n = sec < big ? small + 1 : small;
      const int64_t first = sec < big ? sec * (small + 1) : big * (small + 1) + (sec - big) * small;
      for (int64_t col = 0; col < cols; ++col)
        for (int64_t i = 0; i < n; ++i, ++x) {
          const GridSlot s = grid_order(x, cols, bhs, kOrderSections, false, sections);
          EXPECT_EQ(s.col, col) << "x " << x << " cols " << cols << " bh " << bhs << " sections "
                                << sections;
          EXPECT_EQ(s.bh, first + i) << "x " << x << " cols " << cols << " bh " << bhs;
        }
    }
    EXPECT_EQ(x, cols * bhs);
  }
  // One section is lpt.
  for (int64_t x = 0; x < 5 * 7; ++x) {
    const GridSlot a = grid_order(x, 5, 7, kOrderSections, false, 1);
    const GridSlot b = grid_order(x, 5, 7, kOrderLpt, false);
    EXPECT_EQ(a.col, b.col);
    EXPECT_EQ(a.bh, b.bh);
  }
}

TEST(BwdGridOrder, SectionCountKeepsASectionsRowsInHalfTheL2AndWholeWaves) {
  const auto prob = [](int64_t b, int64_t hq, int64_t hkv, int64_t n, int64_t d) {
    AttentionProblem p;
    p.batch = b, p.heads_q = hq, p.heads_kv = hkv, p.seqlen_q = p.seqlen_kv = n, p.head_dim = d;
    p.causal = true;
    return p;
  };
  constexpr int64_t sms = 132, l2 = 50 << 20;
  // d128 N2048, 8 x 16 heads: 2 MiB of Q, dO and dQ rows a head, 12 of them in half the L2 (16 would fill two
  // waves of 16 column blocks); 12 heads are 1.45 waves, cut to one wave: 16 sections of 8 heads.
  EXPECT_EQ(section_count(prob(8, 16, 16, 2048, 128), 64, 16, sms, l2), 16);
  // d128 N8192, 2 x 16 heads: 8 MiB a head, 3 in half the L2 (1.45 waves of 64 column blocks), cut to 2 (0.97).
  EXPECT_EQ(section_count(prob(2, 16, 16, 8192, 128), 64, 64, sms, l2), 16);
  // d128 N16384, 16 heads: 16 MiB a head, one head a section.
  EXPECT_EQ(section_count(prob(1, 16, 16, 16384, 128), 64, 128, sms, l2), 16);
  // d64 N1024, 16 x 32 heads: 0.5 MiB a head, but two waves hold 33 heads' 8 column blocks: 16 sections.
  EXPECT_EQ(section_count(prob(16, 32, 32, 1024, 64), 128, 8, sms, l2), 16);
  // GQA counts the group's query heads: 8 query heads a pair at d128 N4096 are 32 MiB, one pair a section.
  EXPECT_EQ(section_count(prob(4, 64, 8, 4096, 128), 64, 32, sms, l2), 32);
  // Never more sections than pairs, never fewer than one.
  EXPECT_EQ(section_count(prob(1, 1, 1, 1, 64), 128, 1, sms, l2), 1);
}

TEST(BwdGridOrder, DeterministicOrderLaunchesEachHeadFromItsLastColumn) {
  // A row block's dQ partials are added from the rightmost column block leftwards, so every CTA's predecessors in
  // that order (the same (batch, kv head), a larger column) must be launched before it.
  for (auto [cols, bhs] : {std::pair<int64_t, int64_t>{1, 3}, {5, 1}, {9, 4}, {16, 12}}) {
    std::vector<int64_t> x_of(static_cast<size_t>(cols * bhs));
    std::vector<int64_t> next_col(static_cast<size_t>(bhs), cols - 1);
    for (int64_t x = 0; x < cols * bhs; ++x) {
      const GridSlot s = grid_order(x, cols, bhs, kOrderNatural, true);
      EXPECT_EQ(s.col, next_col[static_cast<size_t>(s.bh)]) << "x " << x;
      --next_col[static_cast<size_t>(s.bh)];
      x_of[static_cast<size_t>(s.bh * cols + s.col)] = x;
    }
    for (int64_t bh = 0; bh < bhs; ++bh)
      for (int64_t col = 0; col + 1 < cols; ++col)
        EXPECT_LT(x_of[static_cast<size_t>(bh * cols + col + 1)],
                  x_of[static_cast<size_t>(bh * cols + col)]);
  }
}

// The kernel runs the order in 32-bit ints (grid_order_in<int>): the same CTA order as the host's 64-bit one.
TEST(BwdGridOrder, GridOrderIn32BitsMatches64) {
  for (auto [cols, bhs] : {std::pair<int, int>{1, 3}, {5, 7}, {16, 12}, {7, 33}, {128, 16}})
    for (int order : {kOrderNatural, kOrderLpt, kOrderSections})
      for (bool det : {false, true})
        for (int sections : {1, 3, 5}) {
          if (sections > bhs)
            continue;
          for (int x = 0; x < cols * bhs; ++x) {
            const GridSlot a = grid_order_in<int>(x, cols, bhs, order, det, sections);
            const GridSlot b = grid_order(x, cols, bhs, order, det, sections);
            ASSERT_EQ(a.col, b.col) << "x " << x << " order " << order;
            ASSERT_EQ(a.bh, b.bh) << "x " << x << " order " << order;
          }
        }
}

TEST(BwdGridOrder, LptLaunchesEveryHeadsFirstColumnBeforeAnySecond) {
  for (auto [cols, bhs] : {std::pair<int64_t, int64_t>{2, 1}, {5, 3}, {16, 12}, {7, 33}}) {
    int64_t last_col0 = -1, first_col1 = cols * bhs, prev_col = 0;
    for (int64_t x = 0; x < cols * bhs; ++x) {
      const GridSlot s = grid_order(x, cols, bhs, kOrderLpt, false);
      EXPECT_GE(s.col, prev_col) << "x " << x; // longest (leftmost under causal) first, every head
      prev_col = s.col;
      if (s.col == 0)
        last_col0 = x;
      if (s.col == 1)
        first_col1 = std::min(first_col1, x);
    }
    EXPECT_EQ(last_col0, bhs - 1);
    EXPECT_LT(last_col0, first_col1);
  }
}
