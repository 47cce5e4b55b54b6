// kernels/common/bwd.hpp: the rotated row order's starts and ranks, against the order in which the column blocks
// reach each row block when all run at one speed.
#include "kernels/common/bwd.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

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
