// flashbench list: the catalog, its variants and their config spaces.
#include "commands.hpp"

#include "flashbench/tuner.hpp"
#include "flashbench/variant.hpp"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

namespace fb::cli {

namespace {

void list_catalog(bool as_json) {
  nlohmann::json out = nlohmann::json::array();
  const auto &hashes = variant_source_hashes();
  for (const auto &v : catalog().all()) {
    const auto h = hashes.find(v->name());
    const std::string source_hash = h == hashes.end() ? "" : h->second;
    nlohmann::json axes = nlohmann::json::array();
    for (const auto &a : v->space().axes()) {
      nlohmann::json vals = nlohmann::json::array();
      for (int64_t x : a.values)
        vals.push_back(a.labels.empty() ? nlohmann::json(x) : nlohmann::json(a.label_of(x)));
      axes.push_back({{"name", a.name}, {"values", vals}, {"help", a.help}});
    }
    out.push_back({{"name", v->name()},
                   {"pass", to_string(v->pass())},
                   {"description", v->description()},
                   {"axes", axes},
                   {"configs", v->space().size()},
                   {"default", v->space().to_json(v->space().default_config())},
                   {"source_hash", source_hash}});
    if (!as_json) {
      std::printf("%s (%s)\n  %s\n  %zu configs; default %s; sources %s\n", v->name().c_str(),
                  to_string(v->pass()), v->description().c_str(), v->space().size(),
                  v->space().to_string(v->space().default_config()).c_str(),
                  source_hash.empty() ? "?" : source_hash.c_str());
      for (const auto &a : v->space().axes()) {
        std::printf("    %-18s", a.name.c_str());
        for (size_t i = 0; i < a.values.size(); ++i)
          std::printf("%s%s", i ? ", " : "", a.label_of(a.values[i]).c_str());
        std::printf("%s%s\n", a.help.empty() ? "" : "   # ", a.help.c_str());
      }
    }
  }
  if (as_json)
    std::printf("%s\n", out.dump(2).c_str());
}

} // namespace

Command add_list(CLI::App &app, const Globals &) {
  auto *sub = app.add_subcommand("list", "the catalog: variants and their config spaces");
  auto as_json = std::make_shared<bool>(false);
  sub->add_flag("--json", *as_json, "machine-readable");
  return {sub, [as_json] {
            list_catalog(*as_json);
            return 0;
          }};
}

} // namespace fb::cli
