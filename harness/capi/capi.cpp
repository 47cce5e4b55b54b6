// flashbench's C API (flashbench/capi.h): the catalog behind extern "C" functions, every exception turned into a
// status and a one-line reason. A launcher serves one pass, its problem's: fb_capi_launch the forward,
// fb_capi_launch_backward the backward.
#include "flashbench/capi.h"

#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/config.hpp"
#include "flashbench/dispatch.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/variant.hpp"
#include "flashbench/version.hpp"

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

struct fb_capi_launcher {
  const fb::Variant *variant = nullptr;
  fb::AttentionProblem problem;
  fb::Config config;
  std::string config_str;
  std::string variant_name, choice; // fb_capi_variant, fb_capi_choice
  fb::DeviceBuffer workspace, semaphores, seqlens;
  const float *descales[3] = {nullptr, nullptr, nullptr}; // e4m3: Q, K, V (fb_capi_set_descales)
};

namespace {

thread_local std::string last_error;

thread_local std::string last_choice; // fb_capi_choose's answer

// "a=1,b=on" -> {a: 1, b: on}.
std::map<std::string, std::string> parse_config(const std::string &text) {
  const auto items =
      fb::parse_assignments(text, "config '" + text + "'", "block_m=128,block_n=128");
  return {items.begin(), items.end()};
}

fb::AttentionProblem parse_problem(const char *problem_json) {
  fb::AttentionProblem p;
  try {
    p = nlohmann::json::parse(problem_json).get<fb::AttentionProblem>();
    fb::validate(p);
  } catch (const nlohmann::json::exception &e) {
    throw fb::UserError(std::string("problem_json: ") + e.what());
  } catch (const fb::UserError
               &e) { // a field's value the harness refuses (problem.cpp says which and why)
    throw fb::UserError(std::string("problem_json: ") + e.what());
  }
  if (p.paged())
    throw fb::UserError(
        "problem_json: paged KV caches are not offered through the C API (no page table "
        "argument); run them with `flashbench run`");
  return p;
}

struct Choice {
  const fb::Variant *variant = nullptr;
  fb::Config config;
  std::string source;
};

// VARIANT and CONFIG resolved for p on dev (capi.h, fb_capi_create): "auto" through the dispatcher, "" and
// "default" to the variant's default for the problem, a partial config filled from that default. Refuses what the
// variant does not support.
// What can be said about VARIANT and CONFIG before the problem and the device: an unknown name, a config that does
// not parse or names an unknown axis or value, a config given with "auto".
void precheck(const std::string &name, const std::string &text) {
  if (name == "auto") {
    if (!text.empty() && text != "default" && text != "auto")
      throw fb::UserError("config '" + text +
                          "': variant auto picks the config too; pass \"\" or \"auto\"");
    return;
  }
  const fb::Variant &v = fb::catalog().get(name);
  if (!text.empty() && text != "default" && text != "auto")
    v.space().make(parse_config(text));
}

Choice resolve(const char *variant, const char *config, const fb::AttentionProblem &p,
               const fb::DeviceInfo &dev) {
  const std::string name = variant, text = config ? config : "";
  precheck(name, text);
  Choice c;
  if (name == "auto" || text == "auto") {
    fb::KernelChoice k = fb::choose_kernel(p, dev, name);
    c.variant = k.variant;
    c.config = std::move(k.config);
    c.source = std::move(k.source);
  } else {
    c.variant = &fb::catalog().get(name);
    const fb::ConfigSpace &space = c.variant->space();
    const bool given = !text.empty() && text != "default";
    if (given) {
      c.config = fb::complete_config(*c.variant, parse_config(text), p, dev, &c.source);
      c.source = "given (" + c.source + ")";
    } else {
      c.config = space.default_config(p, dev);
      c.source = "the default for the problem";
    }
  }
  const fb::ConfigSpace &space = c.variant->space();
  if (const auto why = space.check(c.config))
    throw fb::UserError("config " + space.to_string(c.config) + ": " + *why);
  const fb::Support s = fb::support_for(*c.variant, p, c.config, dev);
  if (!s)
    throw fb::UserError(c.variant->name() + " [" + space.to_string(c.config) + "]: " + s.reason);
  return c;
}

template <class F> auto guarded(F &&f, decltype(f()) on_error) -> decltype(f()) {
  try {
    last_error.clear();
    return f();
  } catch (const std::exception &e) {
    last_error = e.what();
    const size_t nl = last_error.find('\n');
    if (nl != std::string::npos)
      last_error.resize(nl);
  } catch (...) {
    last_error = "unknown exception";
  }
  return on_error;
}

} // namespace

extern "C" fb_capi_launcher *fb_capi_create(const char *variant, const char *config,
                                            const char *problem_json) {
  return guarded(
      [&]() -> fb_capi_launcher * {
        if (!variant || !problem_json)
          throw fb::UserError("fb_capi_create: variant and problem_json are required");
        precheck(variant, config ? config : ""); // what needs no device first
        auto l = std::make_unique<fb_capi_launcher>();
        l->problem = parse_problem(problem_json);
        int device = 0;
        FB_CUDA_CHECK(cudaGetDevice(&device));
        Choice c = resolve(variant, config, l->problem, fb::query_device(device));
        l->variant = c.variant;
        l->config = std::move(c.config);
        l->config_str = l->variant->space().to_string(l->config);
        l->variant_name = l->variant->name();
        l->choice = std::move(c.source);
        if (const size_t b = l->variant->workspace_bytes(l->problem, l->config))
          l->workspace = fb::DeviceBuffer(b);
        if (const size_t b = l->variant->semaphore_bytes(l->problem, l->config)) {
          l->semaphores = fb::DeviceBuffer(b);
          FB_CUDA_CHECK(cudaMemset(l->semaphores.get(), 0, b));
        }
        std::vector<int32_t> lens(static_cast<size_t>(l->problem.batch));
        for (int64_t b = 0; b < l->problem.batch; ++b)
          lens[static_cast<size_t>(b)] = int32_t(l->problem.kv_len(b));
        l->seqlens = fb::DeviceBuffer(lens.size() * sizeof(int32_t));
        FB_CUDA_CHECK(cudaMemcpy(l->seqlens.get(), lens.data(), lens.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice));
        return l.release();
      },
      nullptr);
}

extern "C" const char *fb_capi_choose(const char *variant, const char *config,
                                      const char *problem_json) {
  return guarded(
      [&]() -> const char * {
        if (!variant || !problem_json)
          throw fb::UserError("fb_capi_choose: variant and problem_json are required");
        const fb::AttentionProblem p = parse_problem(problem_json);
        fb::DeviceInfo dev = fb::nominal_device();
        if (int device = 0; fb::device_count() > 0 && cudaGetDevice(&device) == cudaSuccess)
          dev = fb::query_device(device);
        const Choice c = resolve(variant, config, p, dev);
        last_choice = nlohmann::json{
            {"variant", c.variant->name()},
            {"config", c.variant->space().to_string(c.config)},
            {"source", c.source},
            {"device",
             dev.name}}.dump();
        return last_choice.c_str();
      },
      nullptr);
}

extern "C" const char *fb_capi_variant(const fb_capi_launcher *l) {
  return l ? l->variant_name.c_str() : "";
}

extern "C" const char *fb_capi_choice(const fb_capi_launcher *l) {
  return l ? l->choice.c_str() : "";
}

extern "C" const char *fb_capi_config_string(const fb_capi_launcher *l) {
  return l ? l->config_str.c_str() : "";
}

namespace {

// The arguments every launch passes on: the launcher's workspace, semaphores, KV lengths and descales.
fb::LaunchArgs launcher_args(const fb_capi_launcher &l) {
  fb::LaunchArgs a;
  a.workspace = l.workspace.get(), a.workspace_bytes = l.workspace.bytes();
  a.semaphores = l.semaphores.get(), a.semaphore_bytes = l.semaphores.bytes();
  a.cache_seqlens = l.seqlens.as<int32_t>();
  a.q_descale = l.descales[0], a.k_descale = l.descales[1], a.v_descale = l.descales[2];
  return a;
}

} // namespace

extern "C" int fb_capi_launch(fb_capi_launcher *l, const void *q, const void *k, const void *v,
                              void *o, float *lse, void *stream) {
  return guarded(
      [&]() -> int {
        if (!l || !q || !k || !v || !o || !lse)
          throw fb::UserError("fb_capi_launch: a null launcher or buffer");
        if (l->problem.pass != fb::Pass::fwd)
          throw fb::UserError(
              "fb_capi_launch: the launcher's problem is a backward (pass bwd); launch it "
              "with fb_capi_launch_backward");
        if (l->problem.dtype == fb::DType::e4m3 && !l->descales[0])
          throw fb::UserError(
              "fb_capi_launch: an e4m3 problem needs its descales first (fb_capi_set_descales)");
        fb::LaunchArgs a = launcher_args(*l);
        a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse;
        l->variant->launch(l->problem, l->config, a, static_cast<cudaStream_t>(stream));
        FB_CHECK_LAUNCH();
        return 0;
      },
      -1);
}

extern "C" int fb_capi_launch_backward(fb_capi_launcher *l, const void *q, const void *k,
                                       const void *v, const void *o, const float *lse,
                                       const void *dout, void *dq, void *dk, void *dv,
                                       void *stream) {
  return guarded(
      [&]() -> int {
        if (!l || !q || !k || !v || !o || !lse || !dout || !dq || !dk || !dv)
          throw fb::UserError("fb_capi_launch_backward: a null launcher or buffer");
        if (l->problem.pass != fb::Pass::bwd)
          throw fb::UserError(
              "fb_capi_launch_backward: the launcher's problem is a forward; create it on "
              "a problem with \"pass\": \"bwd\" and a backward variant");
        fb::LaunchArgs a = launcher_args(*l);
        // O and LSE are the backward's inputs: LaunchArgs keeps the forward's mutable pointers, and a backward
        // variant does not write them (variant.hpp).
        a.q = q, a.k = k, a.v = v, a.o = const_cast<void *>(o), a.lse = const_cast<float *>(lse);
        a.dout = dout, a.dq = dq, a.dk = dk, a.dv = dv;
        l->variant->launch(l->problem, l->config, a, static_cast<cudaStream_t>(stream));
        FB_CHECK_LAUNCH();
        return 0;
      },
      -1);
}

extern "C" int fb_capi_set_descales(fb_capi_launcher *l, const float *q_descale,
                                    const float *k_descale, const float *v_descale) {
  return guarded(
      [&]() -> int {
        if (!l || l->problem.dtype != fb::DType::e4m3)
          throw fb::UserError(
              "fb_capi_set_descales: the launcher is null or its problem is not e4m3");
        if (!q_descale || !k_descale || !v_descale)
          throw fb::UserError("fb_capi_set_descales: a null descale");
        l->descales[0] = q_descale, l->descales[1] = k_descale, l->descales[2] = v_descale;
        return 0;
      },
      -1);
}

extern "C" void fb_capi_destroy(fb_capi_launcher *l) { delete l; }

extern "C" const char *fb_capi_last_error(void) { return last_error.c_str(); }

extern "C" const char *fb_capi_build(void) {
  static const std::string build = nlohmann::json{
      {"source_sha", fb::git_sha()},
      {"options", fb::build_options()},
      {"toolkit", fb::toolkit()}}.dump();
  return build.c_str();
}
