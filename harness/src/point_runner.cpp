#include "point_runner.hpp"

#include "flashbench/check.hpp"
#include "flashbench/nvtx.hpp"
#include "flashbench/reference.hpp"

#include <chrono>
#include <random>
#include <thread>

namespace fb {

void wait_with_deadline(cudaStream_t stream, double deadline_s) {
  cudaEvent_t done;
  FB_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  FB_CUDA_CHECK(cudaEventRecord(done, stream));
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t st = cudaEventQuery(done);
    if (st == cudaSuccess)
      break;
    if (st != cudaErrorNotReady) {
      cudaEventDestroy(done);
      FB_CUDA_CHECK(st);
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > deadline_s)
      throw PointTimeout("launch still running after " +
                         std::to_string(static_cast<int>(deadline_s)) + " s (hung kernel?)");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  cudaEventDestroy(done);
}

void PointRunner::prepare(const AttentionProblem &p) {
  if (prepared_ && p == problem_)
    return;
  ScopedRange range{"prepare"};
  prepared_ = false;
  problem_ = p;
  kv_cache_ = KvCacheBuffers();
  seed_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  const size_t e = static_cast<size_t>(dtype_bytes(p.dtype));
  q_ = DeviceBuffer(p.q_elems() * e);
  k_ = DeviceBuffer(p.kv_elems() * e);
  v_ = DeviceBuffer(p.kv_elems() * e);
  o_ = DeviceBuffer(p.q_elems() * static_cast<size_t>(dtype_bytes(out_dtype(p.dtype))));
  lse_ = DeviceBuffer(p.lse_elems() * sizeof(float));
  for (DeviceBuffer &d : descales_)
    d = DeviceBuffer();
  ref_o_abs_.clear();
  for (DeviceBuffer *d : {&dout_, &dq_, &dk_, &dv_})
    *d = DeviceBuffer();
  ref_grad_ = BackwardReference();
  input_bytes_.clear();
  if (p.pass == Pass::bwd) {
    prepare_backward(p);
  } else if (p.dtype == DType::e4m3) {
    // Quantized per block (buffers.hpp); the reference runs in fp32/fp64 on the dequantized values, so it sees
    // exactly the inputs the kernel sees.
    descales_[0] = DeviceBuffer(static_cast<size_t>(p.q_descale_elems()) * sizeof(float));
    descales_[1] = DeviceBuffer(static_cast<size_t>(p.k_descale_elems()) * sizeof(float));
    descales_[2] = DeviceBuffer(static_cast<size_t>(p.v_descale_elems()) * sizeof(float));
    DeviceBuffer values[3] = {DeviceBuffer(p.q_elems() * sizeof(float)),
                              DeviceBuffer(p.kv_elems() * sizeof(float)),
                              DeviceBuffer(p.kv_elems() * sizeof(float))};
    void *const codes[3] = {q_.get(), k_.get(), v_.get()};
    float *const ds[3] = {descales_[0].as<float>(), descales_[1].as<float>(),
                          descales_[2].as<float>()};
    float *const vals[3] = {values[0].as<float>(), values[1].as<float>(), values[2].as<float>()};
    const uint64_t seeds[3] = {seed_, seed_ + 1, seed_ + 2};
    fill_e4m3_inputs(p, codes, ds, vals, seeds, stream_);
    AttentionProblem pf = p;
    pf.dtype = DType::f32;
    FB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    compute_reference(pf, values[0].get(), values[1].get(), values[2].get());
    // The element bound's scale (Tolerance::p_round): the same attention over |V|.
    std::vector<double> o = std::move(ref_o_), lse = std::move(ref_lse_);
    abs_inplace(values[2].as<float>(), p.kv_elems(), stream_);
    FB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    compute_reference(pf, values[0].get(), values[1].get(), values[2].get());
    ref_o_abs_ = std::move(ref_o_);
    ref_o_ = std::move(o);
    ref_lse_ = std::move(lse);
  } else {
    fill_normal(q_.get(), p.dtype, p.q_elems(), seed_, 1.0f, stream_);
    fill_normal(k_.get(), p.dtype, p.kv_elems(), seed_ + 1, 1.0f, stream_);
    fill_normal(v_.get(), p.dtype, p.kv_elems(), seed_ + 2, 1.0f, stream_);
    FB_CUDA_CHECK(cudaStreamSynchronize(stream_));
    compute_reference(p, q_.get(), k_.get(), v_.get());
  }
  kv_cache_ = build_kv_cache(p, k_.get(), v_.get(), seed_ + 3, stream_);
  if (p.paged()) { // the kernels read the pools; the contiguous copies served the reference only
    k_ = DeviceBuffer();
    v_ = DeviceBuffer();
  }
  prepared_ = true;
}

namespace {
std::vector<unsigned char> download_bytes(const DeviceBuffer &b) {
  std::vector<unsigned char> h(b.bytes());
  if (!h.empty())
    FB_CUDA_CHECK(cudaMemcpy(h.data(), b.get(), h.size(), cudaMemcpyDeviceToHost));
  return h;
}
} // namespace

void PointRunner::prepare_backward(const AttentionProblem &p) {
  const size_t e = static_cast<size_t>(dtype_bytes(p.dtype));
  dout_ = DeviceBuffer(p.q_elems() * e);
  dq_ = DeviceBuffer(p.q_elems() * e);
  dk_ = DeviceBuffer(p.kv_elems() * e);
  dv_ = DeviceBuffer(p.kv_elems() * e);
  fill_normal(q_.get(), p.dtype, p.q_elems(), seed_, 1.0f, stream_);
  fill_normal(k_.get(), p.dtype, p.kv_elems(), seed_ + 1, 1.0f, stream_);
  fill_normal(v_.get(), p.dtype, p.kv_elems(), seed_ + 2, 1.0f, stream_);
  fill_normal(dout_.get(), p.dtype, p.q_elems(), seed_ + 4, 1.0f, stream_);
  FB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The forward's O and LSE, from the forward reference of the same inputs: O rounded to the dtype (what a
  // verified forward kernel hands the backward), LSE in fp32.
  AttentionProblem fwd = p;
  fwd.pass = Pass::fwd;
  compute_reference(fwd, q_.get(), k_.get(), v_.get());
  {
    const std::vector<float> o(ref_o_.begin(), ref_o_.end()), lse(ref_lse_.begin(), ref_lse_.end());
    DeviceBuffer o32(o.size() * sizeof(float));
    FB_CUDA_CHECK(cudaMemcpy(o32.get(), o.data(), o32.bytes(), cudaMemcpyHostToDevice));
    FB_CUDA_CHECK(cudaMemcpy(lse_.get(), lse.data(), lse_.bytes(), cudaMemcpyHostToDevice));
    convert_from_float(o_.get(), p.dtype, o32.as<float>(), p.q_elems(), stream_);
    FB_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  ref_o_.clear(); // the gradients are what is checked
  ref_lse_.clear();
  for (const auto &[name, buf] : backward_inputs())
    input_bytes_.push_back(download_bytes(*buf));
  if (use_cpu_reference(p)) {
    const auto qh = download_as_float(q_.get(), p.dtype, p.q_elems());
    const auto kh = download_as_float(k_.get(), p.dtype, p.kv_elems());
    const auto vh = download_as_float(v_.get(), p.dtype, p.kv_elems());
    const auto oh = download_as_float(o_.get(), p.dtype, p.q_elems());
    const auto doh = download_as_float(dout_.get(), p.dtype, p.q_elems());
    const auto lh = download_as_float(lse_.get(), DType::f32, p.lse_elems());
    ref_grad_ = cpu_reference_backward(p, qh.data(), kh.data(), vh.data(), oh.data(), doh.data(),
                                       lh.data());
    reference_kind_ = "cpu_f64";
  } else {
    const size_t qb = static_cast<size_t>(p.q_elems()) * sizeof(float),
                 kb = static_cast<size_t>(p.kv_elems()) * sizeof(float);
    DeviceBuffer bufs[9] = {DeviceBuffer(qb), DeviceBuffer(qb), DeviceBuffer(qb),
                            DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb),
                            DeviceBuffer(kb), DeviceBuffer(kb), DeviceBuffer(kb)};
    BackwardReferenceDevice out;
    out.dq = bufs[0].as<float>(), out.dq_abs = bufs[1].as<float>(),
    out.dq_floor = bufs[2].as<float>();
    out.dk = bufs[3].as<float>(), out.dk_abs = bufs[4].as<float>(),
    out.dk_floor = bufs[5].as<float>();
    out.dv = bufs[6].as<float>(), out.dv_abs = bufs[7].as<float>(),
    out.dv_floor = bufs[8].as<float>();
    gpu_reference_backward(p, q_.get(), k_.get(), v_.get(), o_.get(), dout_.get(), lse_.as<float>(),
                           out, stream_);
    auto host = [](const DeviceBuffer &b, int64_t n) {
      const auto f = download_as_float(b.get(), DType::f32, n);
      return std::vector<double>(f.begin(), f.end());
    };
    GradientReference *g[3] = {&ref_grad_.dq, &ref_grad_.dk, &ref_grad_.dv};
    for (int t = 0; t < 3; ++t) {
      const int64_t n = t == 0 ? p.q_elems() : p.kv_elems();
      g[t]->value = host(bufs[3 * t], n);
      g[t]->abs = host(bufs[3 * t + 1], n);
      g[t]->floor = host(bufs[3 * t + 2], n);
    }
    reference_kind_ = "gpu_f32";
  }
}

void PointRunner::compute_reference(const AttentionProblem &p, const void *q, const void *k,
                                    const void *v) {
  if (use_cpu_reference(p)) {
    const auto qh = download_as_float(q, p.dtype, p.q_elems());
    const auto kh = download_as_float(k, p.dtype, p.kv_elems());
    const auto vh = download_as_float(v, p.dtype, p.kv_elems());
    ReferenceOutput ref = cpu_reference(p, qh.data(), kh.data(), vh.data());
    ref_o_ = std::move(ref.o);
    ref_lse_ = std::move(ref.lse);
    reference_kind_ = "cpu_f64";
  } else {
    DeviceBuffer o_ref(p.q_elems() * sizeof(float)), lse_ref(p.lse_elems() * sizeof(float));
    gpu_reference(p, q, k, v, o_ref.as<float>(), lse_ref.as<float>(), stream_);
    const auto o = download_as_float(o_ref.get(), DType::f32, p.q_elems());
    const auto l = download_as_float(lse_ref.get(), DType::f32, p.lse_elems());
    ref_o_.assign(o.begin(), o.end());
    ref_lse_.assign(l.begin(), l.end());
    reference_kind_ = "gpu_f32";
  }
}

void PointRunner::ensure_workspace(size_t bytes) {
  if (workspace_.bytes() >= bytes && bytes > 0)
    return;
  if (bytes == 0)
    return;
  workspace_ = DeviceBuffer(); // free first so the old and new never coexist
  workspace_ = DeviceBuffer(bytes);
}

void PointRunner::ensure_semaphores(size_t bytes) {
  if (bytes == 0 || semaphores_.bytes() >= bytes)
    return;
  semaphores_ = DeviceBuffer();
  semaphores_ = DeviceBuffer(bytes);
  FB_CUDA_CHECK(cudaMemsetAsync(semaphores_.get(), 0, bytes, stream_));
}

LaunchArgs PointRunner::args() const {
  LaunchArgs a;
  a.q = q_.get();
  a.k = problem_.paged() ? kv_cache_.k_pages.get() : k_.get();
  a.v = problem_.paged() ? kv_cache_.v_pages.get() : v_.get();
  a.cache_seqlens = kv_cache_.seqlens.as<int32_t>();
  a.page_table = kv_cache_.page_table.as<int32_t>();
  a.pages_per_seq = problem_.pages_per_seq();
  a.o = o_.get();
  a.lse = lse_.as<float>();
  a.workspace = workspace_.get();
  a.workspace_bytes = workspace_.bytes();
  a.semaphores = semaphores_.get();
  a.semaphore_bytes = semaphores_.bytes();
  a.dout = dout_.get();
  a.dq = dq_.get();
  a.dk = dk_.get();
  a.dv = dv_.get();
  a.q_descale = descales_[0].as<float>();
  a.k_descale = descales_[1].as<float>();
  a.v_descale = descales_[2].as<float>();
  return a;
}

VerifyResult PointRunner::verify(const Variant &v, const Config &c, double deadline_s) {
  ScopedRange range{"verify"};
  const AttentionProblem &p = problem_;
  ensure_workspace(v.workspace_bytes(p, c));
  ensure_semaphores(v.semaphore_bytes(p, c));
  const bool bwd = p.pass == Pass::bwd;
  if (bwd) {
    // O and LSE are the backward's inputs: only the gradients are poisoned. So is the workspace, which the
    // contract does not zero (LaunchArgs): a variant that takes fp32 accumulators for zeroed fails here.
    for (const DeviceBuffer *d : {&dq_, &dk_, &dv_, &workspace_})
      poison(d->get(), d->bytes(), stream_);
  } else {
    poison(o_.get(), o_.bytes(), stream_);
    poison(lse_.get(), lse_.bytes(), stream_);
  }
  v.launch(p, c, args(), stream_);
  FB_CHECK_LAUNCH();
  wait_with_deadline(stream_, deadline_s);
  VerifyResult r;
  if (bwd) {
    r = verify_backward_outputs();
  } else {
    const auto out = download_as_float(o_.get(), out_dtype(p.dtype), p.q_elems());
    const auto lse = download_as_float(lse_.get(), DType::f32, p.lse_elems());
    r = fb::verify<double>(p, out.data(), lse.data(), ref_o_.data(), ref_lse_.data(),
                           tolerance_for(p.dtype),
                           ref_o_abs_.empty() ? nullptr : ref_o_abs_.data());
  }
  r.reference = reference_kind_;
  if (const int64_t nz = count_nonzero_bytes(semaphores_.get(), semaphores_.bytes()); nz > 0) {
    r.pass = false;
    r.detail = std::to_string(nz) +
               " semaphore bytes left non-zero after the launch (the next launch would "
               "read them); " +
               r.detail;
  }
  return r;
}

std::vector<std::pair<const char *, const DeviceBuffer *>> PointRunner::backward_inputs() const {
  return {{"Q", &q_}, {"K", &k_}, {"V", &v_}, {"O", &o_}, {"dO", &dout_}, {"LSE", &lse_}};
}

VerifyResult PointRunner::verify_backward_outputs() const {
  const AttentionProblem &p = problem_;
  const auto dq = download_as_float(dq_.get(), p.dtype, p.q_elems());
  const auto dk = download_as_float(dk_.get(), p.dtype, p.kv_elems());
  const auto dv = download_as_float(dv_.get(), p.dtype, p.kv_elems());
  VerifyResult r =
      verify_backward(p, dq.data(), dk.data(), dv.data(), ref_grad_, grad_tolerance_for(p.dtype));
  const auto inputs = backward_inputs();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (download_bytes(*inputs[i].second) != input_bytes_[i]) {
      r.pass = false;
      r.detail = std::string("the launch wrote its input ") + inputs[i].first +
                 " (the backward only reads Q, K, V, O, dO and LSE)" +
                 (r.detail.empty() ? "" : "; ") + r.detail;
    }
  return r;
}

} // namespace fb
