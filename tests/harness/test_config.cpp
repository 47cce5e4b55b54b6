#include "flashbench/config.hpp"
#include "flashbench/errors.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace fb;

namespace {
ConfigSpace space() {
  std::vector<Axis> axes = {{"block_m", {64, 128}, {}, ""},
                            {"block_n", {32, 64, 128}, {}, ""},
                            {"warp_layout", {0, 1}, {"split_q", "split_k"}, ""}};
  Config def({{"block_m", 64}, {"block_n", 64}, {"warp_layout", 0}});
  return ConfigSpace(axes, def, [](const Config &c) -> std::optional<std::string> {
    if (c.get("block_m") == 128 && c.get("block_n") == 128)
      return "128x128 tile needs too much shared memory";
    return std::nullopt;
  });
}
} // namespace

TEST(Config, ExpandIsTheCartesianProductWithReasons) {
  const auto entries = space().expand();
  ASSERT_EQ(entries.size(), 12u);
  int invalid = 0;
  for (const auto &e : entries)
    invalid += e.invalid_reason.has_value();
  EXPECT_EQ(invalid, 2); // (128,128) x both layouts, reported, not dropped
  EXPECT_EQ(entries.front().config.get("block_m"), 64);
  EXPECT_EQ(entries.back().config.get("warp_layout"), 1);
}

TEST(Config, MakeFillsDefaultsAndReadsLabels) {
  const ConfigSpace s = space();
  const Config c = s.make({{"block_n", "128"}, {"warp_layout", "split_k"}});
  EXPECT_EQ(c.get("block_m"), 64);
  EXPECT_EQ(c.get("block_n"), 128);
  EXPECT_EQ(c.get("warp_layout"), 1);
  EXPECT_EQ(s.to_string(c), "block_m=64,block_n=128,warp_layout=split_k");
  EXPECT_EQ(s.to_json(c)["warp_layout"], "split_k");
}

TEST(Config, MakeRejectsUnknownNamesAndValues) {
  const ConfigSpace s = space();
  EXPECT_THROW(s.make({{"block_k", "64"}}), UserError);
  EXPECT_THROW(s.make({{"block_m", "96"}}), UserError);
  EXPECT_THROW(s.make({{"warp_layout", "split_x"}}), UserError);
  EXPECT_THROW(s.make({{"block_m", "6x"}}), UserError);
}

TEST(Config, EmptySpaceHasOneDefaultConfig) {
  ConfigSpace s;
  EXPECT_EQ(s.expand().size(), 1u);
  EXPECT_EQ(s.to_string(s.default_config()), "default");
}

TEST(Config, ParseAssignmentsKeepsOrderAndNamesTheBadItem) {
  using V = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(parse_assignments("block_m=128,pingpong=on", "--config", "e"),
            (V{{"block_m", "128"}, {"pingpong", "on"}}));
  EXPECT_EQ(parse_assignments("", "--config", "e"), V{});
  try {
    parse_assignments("block_m=64,block_n", "--config", "--config block_m=64");
    FAIL() << "no error for an item without '='";
  } catch (const UserError &e) {
    EXPECT_EQ(std::string(e.what()),
              "--config: 'block_n' is not name=value; e.g. --config block_m=64");
  }
  EXPECT_THROW(parse_assignments("=1", "--shape", "e"), UserError);
}
