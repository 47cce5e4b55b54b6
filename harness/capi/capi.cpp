// flashbench's C API (flashbench/capi.h): the catalog behind extern "C" functions, every exception turned into a
// status and a one-line reason.
#include "flashbench/capi.h"

#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/config.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/variant.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

struct fb_capi_launcher {
  const fb::Variant* variant = nullptr;
  fb::AttentionProblem problem;
  fb::Config config;
  std::string config_str;
  fb::DeviceBuffer workspace, semaphores, seqlens;
  const float* descales[3] = {nullptr, nullptr, nullptr}; // e4m3: Q, K, V (fb_capi_set_descales)
};

namespace {

thread_local std::string last_error;

// "a=1,b=on" -> {a: 1, b: on}; "" and "default" -> {} (the variant's default).
std::map<std::string, std::string> parse_config(const std::string& text) {
  if (text.empty() || text == "default") return {};
  const auto items = fb::parse_assignments(text, "config '" + text + "'", "block_m=128,block_n=128");
  return {items.begin(), items.end()};
}

template <class F> auto guarded(F&& f, decltype(f()) on_error) -> decltype(f()) {
  try {
    last_error.clear();
    return f();
  } catch (const std::exception& e) {
    last_error = e.what();
    const size_t nl = last_error.find('\n');
    if (nl != std::string::npos) last_error.resize(nl);
  } catch (...) {
    last_error = "unknown exception";
  }
  return on_error;
}

} // namespace

extern "C" fb_capi_launcher* fb_capi_create(const char* variant, const char* config, const char* problem_json) {
  return guarded(
      [&]() -> fb_capi_launcher* {
        if (!variant || !problem_json) throw fb::UserError("fb_capi_create: variant and problem_json are required");
        auto l = std::make_unique<fb_capi_launcher>();
        l->variant = &fb::catalog().get(variant);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(problem_json);
          l->problem = j.get<fb::AttentionProblem>();
        } catch (const nlohmann::json::exception& e) {
          throw fb::UserError(std::string("problem_json: ") + e.what());
        }
        fb::validate(l->problem);
        if (l->problem.paged())
          throw fb::UserError("problem_json: paged KV caches are not offered through the C API (no page table "
                              "argument); run them with `flashbench run`");
        const fb::ConfigSpace& space = l->variant->space();
        l->config = space.make(parse_config(config ? config : ""));
        if (const auto why = space.check(l->config)) throw fb::UserError("config " + space.to_string(l->config) +
                                                                         ": " + *why);
        l->config_str = space.to_string(l->config);
        int device = 0;
        FB_CUDA_CHECK(cudaGetDevice(&device));
        const fb::Support s = l->variant->supports(l->problem, l->config, fb::query_device(device));
        if (!s) throw fb::UserError(std::string(variant) + " [" + l->config_str + "]: " + s.reason);
        if (const size_t b = l->variant->workspace_bytes(l->problem, l->config)) l->workspace = fb::DeviceBuffer(b);
        if (const size_t b = l->variant->semaphore_bytes(l->problem, l->config)) {
          l->semaphores = fb::DeviceBuffer(b);
          FB_CUDA_CHECK(cudaMemset(l->semaphores.get(), 0, b));
        }
        std::vector<int32_t> lens(static_cast<size_t>(l->problem.batch));
        for (int64_t b = 0; b < l->problem.batch; ++b) lens[static_cast<size_t>(b)] = int32_t(l->problem.kv_len(b));
        l->seqlens = fb::DeviceBuffer(lens.size() * sizeof(int32_t));
        FB_CUDA_CHECK(cudaMemcpy(l->seqlens.get(), lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
        return l.release();
      },
      nullptr);
}

extern "C" const char* fb_capi_config_string(const fb_capi_launcher* l) { return l ? l->config_str.c_str() : ""; }

extern "C" int fb_capi_launch(fb_capi_launcher* l, const void* q, const void* k, const void* v, void* o, float* lse,
                              void* stream) {
  return guarded(
      [&]() -> int {
        if (!l || !q || !k || !v || !o || !lse) throw fb::UserError("fb_capi_launch: a null launcher or buffer");
        if (l->problem.dtype == fb::DType::e4m3 && !l->descales[0])
          throw fb::UserError("fb_capi_launch: an e4m3 problem needs its descales first (fb_capi_set_descales)");
        fb::LaunchArgs a;
        a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
        a.workspace = l->workspace.get(), a.workspace_bytes = l->workspace.bytes();
        a.semaphores = l->semaphores.get(), a.semaphore_bytes = l->semaphores.bytes();
        a.cache_seqlens = l->seqlens.as<int32_t>();
        a.q_descale = l->descales[0], a.k_descale = l->descales[1], a.v_descale = l->descales[2];
        l->variant->launch(l->problem, l->config, a, static_cast<cudaStream_t>(stream));
        FB_CHECK_LAUNCH();
        return 0;
      },
      -1);
}

extern "C" int fb_capi_set_descales(fb_capi_launcher* l, const float* q_descale, const float* k_descale,
                                    const float* v_descale) {
  return guarded(
      [&]() -> int {
        if (!l || l->problem.dtype != fb::DType::e4m3)
          throw fb::UserError("fb_capi_set_descales: the launcher is null or its problem is not e4m3");
        if (!q_descale || !k_descale || !v_descale) throw fb::UserError("fb_capi_set_descales: a null descale");
        l->descales[0] = q_descale, l->descales[1] = k_descale, l->descales[2] = v_descale;
        return 0;
      },
      -1);
}

extern "C" void fb_capi_destroy(fb_capi_launcher* l) { delete l; }

extern "C" const char* fb_capi_last_error(void) { return last_error.c_str(); }
