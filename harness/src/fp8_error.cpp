// `flashbench fp8-error` (fp8_error.hpp): FP8 attention's error on inputs with outliers, with and without the
// Hadamard rotation, and the rotation's cost against the attention call.
#include "flashbench/fp8_error.hpp"

#include "flashbench/buffers.hpp"
#include "flashbench/check.hpp"
#include "flashbench/device.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/kv_cache.hpp"
#include "flashbench/quantize.hpp"
#include "flashbench/reference.hpp"
#include "flashbench/variant.hpp"
#include "flashbench/version.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

namespace fb {

ErrorStats output_error(const float *o, const double *ref, int64_t n) {
  ErrorStats s;
  if (n <= 0)
    return s;
  double se = 0, sr = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::isfinite(o[i]) ? std::abs(double(o[i]) - ref[i])
                                         : std::numeric_limits<double>::infinity();
    se += e * e;
    sr += ref[i] * ref[i];
    s.max_abs = std::max(s.max_abs, e);
  }
  s.rmse = std::sqrt(se / double(n));
  s.ref_rms = std::sqrt(sr / double(n));
  return s;
}

ErrorStats bf16_rounding_error(const double *ref, int64_t n) {
  std::vector<float> rounded(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(ref[i]);
    uint32_t b = 0;
    std::memcpy(&b, &f, 4);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u; // to nearest even (finite values)
    std::memcpy(&rounded[static_cast<size_t>(i)], &b, 4);
  }
  return output_error(rounded.data(), ref, n);
}

void validate(const OutlierSpec &o) {
  if (o.kind != "normal" && o.kind != "uniform")
    throw UserError(
        "unknown outlier kind '" + o.kind +
        "'; use normal (N(0,1) + N(0,scale^2) Bernoulli(fraction) in Q, K, V) or uniform "
        "(+-U(min, max) in Q and K)");
  if (!(o.fraction >= 0 && o.fraction <= 1))
    throw UserError("the outlier fraction must be in [0, 1]");
  if (!(o.scale >= 0) || !(o.lo >= 0 && o.lo <= o.hi))
    throw UserError("the outlier scale must be >= 0 and 0 <= min <= max");
}

nlohmann::json to_json(const OutlierSpec &o) {
  nlohmann::json j{{"kind", o.kind},
                   {"fraction", o.fraction},
                   {"tensors", o.in_v() ? nlohmann::json{"q", "k", "v"} : nlohmann::json{"q", "k"}},
                   {"originals", "bf16"}};
  if (o.kind == "normal") {
    j["distribution"] = "N(0,1) + N(0, scale^2) * Bernoulli(fraction)";
    j["scale"] = o.scale;
  } else {
    j["distribution"] = "N(0,1), replaced with probability fraction by +-U(min, max)";
    j["magnitude"] = {o.lo, o.hi};
  }
  return j;
}

std::vector<AttentionProblem> default_fp8_error_problems() {
  auto P = [](int64_t b, int64_t hq, int64_t hkv, int64_t n, int64_t d, bool causal) {
    AttentionProblem p;
    p.batch = b;
    p.heads_q = hq;
    p.heads_kv = hkv;
    p.seqlen_q = p.seqlen_kv = n;
    p.head_dim = d;
    p.causal = causal;
    p.dtype = DType::e4m3;
    return p;
  };
  std::vector<AttentionProblem> v;
  for (bool causal : {false, true}) {
    for (int64_t n : {2048, 4096, 8192, 16384})
      v.push_back(P(16384 / n, 16, 16, n, 128, causal));
    v.push_back(P(1, 32, 8, 8192, 128, causal));
  }
  v.push_back(P(4, 16, 16, 4096, 64, false));
  v.push_back(P(4, 16, 16, 4096, 256, false));
  return v;
}

TimingPolicy fp8_error_timing_policy() {
  TimingPolicy t;
  t.min_time_s = 0.2;
  t.timeout_s = 5.0;
  return t;
}

namespace {

nlohmann::json stats_json(const ErrorStats &s) {
  return {{"rmse", s.rmse}, {"max_abs", s.max_abs}, {"ref_rms", s.ref_rms}};
}

nlohmann::json ratio(double a, double b) {
  return b > 0 ? nlohmann::json(a / b) : nlohmann::json();
}

} // namespace

nlohmann::json to_json(const Fp8ErrorRow &r) {
  nlohmann::json j{{"problem", r.problem}, {"key", key(r.problem)}, {"status", r.status}};
  if (r.status != "ok") {
    j["reason"] = r.reason;
    return j;
  }
  j["config"] = r.config;
  j["reference"] = r.reference;
  j["block"] = stats_json(r.block);
  j["block_hadamard"] = stats_json(r.hadamard);
  j["o_bf16_rounding"] = stats_json(r.o_rounding);
  // Above 1: the rotation lowers the error by that factor.
  j["rmse_ratio"] = ratio(r.block.rmse, r.hadamard.rmse);
  j["max_abs_ratio"] = ratio(r.block.max_abs, r.hadamard.max_abs);
  j["timing_us"] = {{"quantize_qk_block", r.quantize_qk_block_us},
                    {"quantize_qk_hadamard", r.quantize_qk_hadamard_us},
                    {"quantize_v", r.quantize_v_us},
                    {"attention_block", r.attention_block_us},
                    {"attention_hadamard", r.attention_hadamard_us}};
  // What the rotation adds to quantizing Q and K, and quantizing Q and K with it, in percent of the attention.
  j["rotation_cost_pct"] =
      r.attention_block_us > 0
          ? nlohmann::json(100.0 * (r.quantize_qk_hadamard_us - r.quantize_qk_block_us) /
                           r.attention_block_us)
          : nlohmann::json();
  j["quantize_qk_hadamard_pct"] =
      r.attention_block_us > 0
          ? nlohmann::json(100.0 * r.quantize_qk_hadamard_us / r.attention_block_us)
          : nlohmann::json();
  return j;
}

std::string fp8_error_header() {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-44s %10s %10s %6s %9s %9s %9s %9s %9s %7s", "problem", "rmse",
                "rmse_had", "ratio", "max", "max_had", "qk_us", "qk_had_us", "attn_us", "rot_%");
  return buf;
}

std::string fp8_error_line(const Fp8ErrorRow &r) {
  char buf[512];
  if (r.status != "ok") {
    std::snprintf(buf, sizeof buf, "%-44s skipped: %s", key(r.problem).c_str(), r.reason.c_str());
    return buf;
  }
  const double att = r.attention_block_us;
  std::snprintf(buf, sizeof buf, "%-44s %10.3e %10.3e %6.2f %9.3e %9.3e %9.1f %9.1f %9.1f %7.2f",
                key(r.problem).c_str(), r.block.rmse, r.hadamard.rmse,
                r.hadamard.rmse > 0 ? r.block.rmse / r.hadamard.rmse : 0.0, r.block.max_abs,
                r.hadamard.max_abs, r.quantize_qk_block_us, r.quantize_qk_hadamard_us, att,
                att > 0 ? 100.0 * (r.quantize_qk_hadamard_us - r.quantize_qk_block_us) / att : 0.0);
  return buf;
}

namespace {

void measure_problem(const Variant &var, const Config &c, const AttentionProblem &p, uint64_t seed,
                     const Fp8ErrorOptions &o, cudaStream_t stream, Timer &timer,
                     Fp8ErrorRow &row) {
  const int64_t nq = p.q_elems(), nkv = p.kv_elems();
  const Strides qs = p.q_strides(), ks = p.kv_strides();
  // The originals: bf16, as a model hands them to the quantizer.
  DeviceBuffer q16(size_t(nq) * 2), k16(size_t(nkv) * 2), v16(size_t(nkv) * 2);
  {
    DeviceBuffer tmp(size_t(std::max(nq, nkv)) * 4);
    const OutlierSpec &ol = o.outliers;
    const bool additive = ol.kind == "normal";
    const float a = additive ? ol.scale : ol.lo, b = ol.hi;
    const struct {
      void *dst;
      int64_t n;
      bool outliers;
    } t[3] = {{q16.get(), nq, true}, {k16.get(), nkv, true}, {v16.get(), nkv, ol.in_v()}};
    for (int i = 0; i < 3; ++i) {
      fill_normal_with_outliers(tmp.as<float>(), t[i].n, seed + uint64_t(i),
                                t[i].outliers ? ol.fraction : 0.0, additive, a, b, stream);
      convert_from_float(t[i].dst, DType::bf16, tmp.as<float>(), t[i].n, stream);
    }
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  AttentionProblem pr = p;
  pr.dtype = DType::bf16;
  pr.quant = Quant::block;
  std::vector<double> ref;
  if (use_cpu_reference(pr)) {
    const auto q = download_as_float(q16.get(), DType::bf16, nq);
    const auto k = download_as_float(k16.get(), DType::bf16, nkv);
    const auto v = download_as_float(v16.get(), DType::bf16, nkv);
    ref = cpu_reference(pr, q.data(), k.data(), v.data()).o;
    row.reference = "cpu_fp64";
  } else {
    DeviceBuffer o32(size_t(nq) * 4), lse32(size_t(p.lse_elems()) * 4);
    gpu_reference(pr, q16.get(), k16.get(), v16.get(), o32.as<float>(), lse32.as<float>(), stream);
    const auto f = download_as_float(o32.get(), DType::f32, nq);
    ref.assign(f.begin(), f.end());
    row.reference = "gpu_fp32";
  }
  row.o_rounding = bf16_rounding_error(ref.data(), nq);

  DeviceBuffer qc(static_cast<size_t>(nq)), kc(static_cast<size_t>(nkv)),
      vc(static_cast<size_t>(nkv));
  DeviceBuffer qd(size_t(p.q_descale_elems()) * 4), kd(size_t(p.k_descale_elems()) * 4),
      vd(size_t(p.v_descale_elems()) * 4);
  DeviceBuffer out(size_t(nq) * 2), lse(size_t(p.lse_elems()) * 4);
  DeviceBuffer ws(var.workspace_bytes(p, c)), sem(var.semaphore_bytes(p, c));
  if (sem.bytes())
    FB_CUDA_CHECK(cudaMemsetAsync(sem.get(), 0, sem.bytes(), stream));
  const KvCacheBuffers kv = build_kv_cache(p, kc.get(), vc.get(), seed + 3, stream);
  const uint64_t sign_seed = seed ^ 0x68616461ull; // one rotation for Q and K
  const QuantizeShape q_shape{p.batch, p.seqlen_q, p.heads_q, p.head_dim, kFp8ScaleBlock};
  const QuantizeShape k_shape{p.batch, p.seqlen_kv, p.heads_kv, p.head_dim, kFp8ScaleBlock};
  const QuantizeShape v_shape{p.batch, p.seqlen_kv, p.heads_kv, p.head_dim, p.seqlen_kv};
  auto quantize_qk = [&](bool rotate, cudaStream_t s) {
    const Rotation rot{rotate, sign_seed};
    quantize_e4m3(q16.get(), DType::bf16, qs, qc.get(), qs, qd.as<float>(), q_shape, rot, s);
    quantize_e4m3(k16.get(), DType::bf16, ks, kc.get(), ks, kd.as<float>(), k_shape, rot, s);
  };
  auto quantize_v = [&](cudaStream_t s) {
    quantize_e4m3(v16.get(), DType::bf16, ks, vc.get(), ks, vd.as<float>(), v_shape, Rotation{}, s);
  };
  LaunchArgs a;
  a.q = qc.get();
  a.k = kc.get();
  a.v = vc.get();
  a.cache_seqlens = kv.seqlens.as<int32_t>();
  a.o = out.get();
  a.lse = lse.as<float>();
  a.workspace = ws.get();
  a.workspace_bytes = ws.bytes();
  a.semaphores = sem.get();
  a.semaphore_bytes = sem.bytes();
  a.q_descale = qd.as<float>();
  a.k_descale = kd.as<float>();
  a.v_descale = vd.as<float>();

  quantize_v(stream);
  for (bool rotate : {false, true}) {
    AttentionProblem pq = p;
    pq.quant = rotate ? Quant::block_hadamard : Quant::block;
    auto attend = [&](cudaStream_t s) { var.launch(pq, c, a, s); };
    quantize_qk(rotate, stream);
    poison(out.get(), out.bytes(), stream);
    poison(lse.get(), lse.bytes(), stream);
    attend(stream);
    FB_CHECK_LAUNCH();
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto got = download_as_float(out.get(), DType::bf16, nq);
    (rotate ? row.hadamard : row.block) = output_error(got.data(), ref.data(), nq);
    (rotate ? row.attention_hadamard_us : row.attention_block_us) =
        timer.measure(attend, o.timing).median_us;
    (rotate ? row.quantize_qk_hadamard_us : row.quantize_qk_block_us) =
        timer.measure([&](cudaStream_t s) { quantize_qk(rotate, s); }, o.timing).median_us;
  }
  row.quantize_v_us = timer.measure(quantize_v, o.timing).median_us;
}

} // namespace

nlohmann::json fp8_error_doc(const Fp8ErrorOptions &o, const nlohmann::json &context,
                             const nlohmann::json &rows, size_t planned) {
  nlohmann::json doc;
  doc["context"] = context;
  doc["outliers"] = to_json(o.outliers);
  doc["timing_policy"] = o.timing;
  doc["rows"] = rows;
  doc["rows_planned"] = planned;
  doc["complete"] = rows.size() == planned;
  return doc;
}

nlohmann::json run_fp8_error(const Fp8ErrorOptions &o, int device, std::ostream &log,
                             const std::function<void(const nlohmann::json &)> &on_rows) {
  const Variant &var = catalog().get(o.variant);
  validate(o.outliers);
  for (const AttentionProblem &p : o.problems) {
    if (p.dtype != DType::e4m3)
      throw UserError("fp8-error measures e4m3 problems, not " + key(p) + "; use dtype=e4m3");
    validate(p);
  }
  FB_CUDA_CHECK(cudaSetDevice(device));
  const DeviceInfo dev = query_device(device);
  cudaStream_t stream;
  FB_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const nlohmann::json context = {{"device", dev},        {"flashbench_version", version()},
                                  {"git_sha", git_sha()}, {"build_options", build_options()},
                                  {"toolkit", toolkit()}, {"variant", o.variant},
                                  {"seed", o.seed}};
  nlohmann::json rows = nlohmann::json::array();
  {
    Timer timer(dev, stream);
    log << fp8_error_header() << "\n";
    for (size_t i = 0; i < o.problems.size(); ++i) {
      Fp8ErrorRow row;
      row.problem = o.problems[i];
      row.problem.quant = Quant::block;
      const AttentionProblem &p = row.problem;
      const Config c = var.space().default_config(p, dev);
      row.config = var.space().to_string(c);
      if (auto why = var.space().check(c)) {
        row.status = "skipped";
        row.reason = "default config invalid: " + *why;
      } else if (Support s = support_for(var, p, c, dev); !s.ok) {
        row.status = "skipped";
        row.reason = s.reason;
      } else if (!hadamard_supported(p.head_dim)) {
        row.status = "skipped";
        row.reason = "the rotation needs head_dim 64, 128 or 256";
      } else {
        measure_problem(var, c, p, quant_splitmix64(o.seed + i), o, stream, timer, row);
      }
      log << fp8_error_line(row) << "\n" << std::flush;
      rows.push_back(to_json(row));
      if (on_rows)
        on_rows(fp8_error_doc(o, context, rows, o.problems.size()));
    }
  }
  FB_CUDA_CHECK(cudaStreamDestroy(stream));
  return fp8_error_doc(o, context, rows, o.problems.size());
}

} // namespace fb
