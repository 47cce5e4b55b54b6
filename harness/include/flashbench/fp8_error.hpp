// `flashbench fp8-error`: the accuracy of FP8 attention on inputs with outliers, with and without incoherent
// processing (quant block vs block_hadamard, quantize.hpp), and what the rotation costs.
//
// For each problem: Q, K, V are drawn as normal(0, 1) in fp32 with a fraction of outlier elements (OutlierSpec),
// then rounded to bf16: these bf16 tensors are the ORIGINAL values, what a model would hand the quantizer. The reference is attention of the
// originals (float64 on the CPU under kCpuReferenceMaxWork, else the fp32 GPU reference). Then, per quantization,
// Q and K are quantized from bf16 by quantize_e4m3 (per 128-token block; rotated or not; one shared rotation), V per
// (batch, kv head); the variant (fa3_fp8 by default) runs its default config on the codes, and its bf16 O is
// compared with the reference: RMSE and max |error| over all elements of O. The timings are the harness's (cold L2,
// CUDA events, medians): quantizing Q and K with and without the rotation, V, and the attention call.
#pragma once

#include "flashbench/problem.hpp"
#include "flashbench/timing.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace fb {

// Which elements are outliers and what they are. "normal" (the default) is the FlashAttention-3 paper's accuracy
// experiment: every element of Q, K and V is N(0, 1) + N(0, scale^2) * Bernoulli(fraction), scale 10. "uniform":
// elements of Q and K (not V) are replaced with probability `fraction` by random sign times U(lo, hi).
struct OutlierSpec {
  std::string kind = "normal"; // normal | uniform
  double fraction = 0.001;     // each element independently
  float scale = 10.f;          // normal: the added term's standard deviation
  float lo = 20.f, hi = 100.f; // uniform: the magnitudes
  bool in_v() const { return kind == "normal"; }
};
// Throws UserError for an unknown kind or out-of-range numbers.
void validate(const OutlierSpec &o);
nlohmann::json to_json(const OutlierSpec &o);

// |o - ref| over n elements: root mean square, max, and the reference's own RMS (so that a relative error can be
// read off). Non-finite outputs count as an infinite error.
struct ErrorStats {
  double rmse = 0, max_abs = 0, ref_rms = 0;
};
ErrorStats output_error(const float *o, const double *ref, int64_t n);
// The error of rounding the reference itself to bf16 (O's dtype): the floor under any kernel's error.
ErrorStats bf16_rounding_error(const double *ref, int64_t n);

// The default problems: d128, N = 2048 .. 16384 at 16384 tokens (batch x N) and 16 heads, causal and not; GQA 32/8
// at N = 8192; and d64 and d256 at N = 4096 (reported as skipped with the variant's reason where it lacks them).
std::vector<AttentionProblem> default_fp8_error_problems();

struct Fp8ErrorOptions {
  std::vector<AttentionProblem> problems; // e4m3 problems; quant is ignored (both are run)
  std::string variant = "fa3_fp8";
  uint64_t seed = 0;
  OutlierSpec outliers;
  TimingPolicy timing;
};

// The timing policy of the experiment: the harness's defaults with a shorter minimum time (seven measurements a
// problem).
TimingPolicy fp8_error_timing_policy();

// One problem's results as JSON (its fields: docs/fp8.md).
struct Fp8ErrorRow {
  AttentionProblem problem;
  std::string status = "ok"; // ok | skipped
  std::string reason;        // why skipped
  std::string config, reference;
  ErrorStats block, hadamard, o_rounding;
  double quantize_qk_block_us = 0, quantize_qk_hadamard_us = 0, quantize_v_us = 0;
  double attention_block_us = 0, attention_hadamard_us = 0;
};
nlohmann::json to_json(const Fp8ErrorRow &r);
// The console line of a row (one line; a header from fp8_error_header()).
std::string fp8_error_header();
std::string fp8_error_line(const Fp8ErrorRow &r);

// The document of a run (context, outliers, timing policy, rows): `rows` so far of `planned` problems, with
// "complete" saying whether every planned row is in (docs/fp8.md).
nlohmann::json fp8_error_doc(const Fp8ErrorOptions &o, const nlohmann::json &context,
                             const nlohmann::json &rows, size_t planned);

// Runs the experiment on `device`, printing a line per problem to `log`; returns the whole document. After each
// row, `on_rows` (if given) gets the document so far, so that a run cut short keeps its finished rows. Throws
// UserError for an unknown variant or a problem that is not e4m3.
nlohmann::json run_fp8_error(const Fp8ErrorOptions &o, int device, std::ostream &log,
                             const std::function<void(const nlohmann::json &)> &on_rows = {});

} // namespace fb
