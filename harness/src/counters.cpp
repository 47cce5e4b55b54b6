#include "flashbench/counters.hpp"

#include "flashbench/check.hpp"
#include "flashbench/errors.hpp"
#include "flashbench/options.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#if FLASHBENCH_WITH_CUPTI
#include <cuda.h>
#include <cupti.h>
#include <cupti_profiler_host.h>
#include <cupti_profiler_target.h>
#include <cupti_range_profiler.h>
#include <cupti_target.h>
#endif

namespace fb {

std::vector<std::string> default_metrics() {
  return {"dram__bytes_read.sum",
          "dram__bytes_write.sum",
          "sm__warps_active.avg.pct_of_peak_sustained_active",
          "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
          "gpu__time_duration.sum",
          "gpc__cycles_elapsed.avg.per_second"};
}

void to_json(nlohmann::json &j, const Counters &c) {
  j = nlohmann::json::object();
  for (const auto &[k, v] : c.values)
    j[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
}

nlohmann::json summarize_counters(const Counters &c) {
  nlohmann::json s = nlohmann::json::object();
  auto put = [&](const char *field, const char *metric, double scale = 1.0) {
    auto it = c.values.find(metric);
    if (it != c.values.end() && std::isfinite(it->second))
      s[field] = it->second * scale;
  };
  put("dram_read_bytes", "dram__bytes_read.sum");
  put("dram_write_bytes", "dram__bytes_write.sum");
  put("achieved_occupancy_pct", "sm__warps_active.avg.pct_of_peak_sustained_active");
  put("tensor_active_pct",
      "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active");
  put("gpu_time_ns", "gpu__time_duration.sum");
  put("sm_clock_hz", "gpc__cycles_elapsed.avg.per_second");
  if (s.contains("dram_read_bytes") && s.contains("dram_write_bytes"))
    s["dram_bytes"] = s["dram_read_bytes"].get<double>() + s["dram_write_bytes"].get<double>();
  return s;
}

// ------------------------------------------------------------------------------------------------- occupancy

Occupancy occupancy_from_resources(const DeviceInfo &dev, int block_threads, int regs_per_thread,
                                   int64_t smem_per_block, int64_t reserved_smem_per_block) {
  Occupancy o;
  o.block_threads = block_threads;
  o.registers_per_thread = regs_per_thread;
  o.smem_per_block = smem_per_block;
  const int warp = 32;
  const int warps_per_block = (block_threads + warp - 1) / warp;
  const int max_warps = dev.max_threads_per_sm / warp;
  o.blocks_by_limit["warps"] = warps_per_block ? max_warps / warps_per_block : 0;
  o.blocks_by_limit["blocks"] = dev.max_blocks_per_sm;
  // Registers are allocated per warp in units of 256 (8 per thread).
  if (regs_per_thread > 0) {
    const int regs_per_warp = ((regs_per_thread * warp + 255) / 256) * 256;
    o.blocks_by_limit["registers"] = dev.regs_per_sm / (regs_per_warp * warps_per_block);
  }
  if (smem_per_block > 0) {
    const int64_t per_block = smem_per_block + reserved_smem_per_block;
    o.blocks_by_limit["shared_memory"] = static_cast<int>(dev.smem_per_sm / per_block);
  }
  o.blocks_per_sm = INT32_MAX;
  // Ties name the resource a tuner can most easily change first: shared memory, then registers.
  for (const char *name : {"shared_memory", "registers", "warps", "blocks"}) {
    auto it = o.blocks_by_limit.find(name);
    if (it != o.blocks_by_limit.end() && it->second < o.blocks_per_sm) {
      o.blocks_per_sm = it->second;
      o.limiter = name;
    }
  }
  o.theoretical_pct = max_warps ? 100.0 * o.blocks_per_sm * warps_per_block / max_warps : 0;
  return o;
}

Occupancy theoretical_occupancy(const DeviceInfo &dev, const KernelDesc &k) {
  cudaFuncAttributes attr{};
  FB_CUDA_CHECK(cudaFuncGetAttributes(&attr, k.func));
  Occupancy o =
      occupancy_from_resources(dev, k.block_threads, attr.numRegs,
                               static_cast<int64_t>(attr.sharedSizeBytes + k.dynamic_smem));
  o.kernel = k.name;
  int blocks = 0;
  FB_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.func, k.block_threads,
                                                              k.dynamic_smem));
  if (blocks != o.blocks_per_sm) {
    // The runtime knows allocation details we do not model; its count wins and the limiter becomes unknown.
    o.limiter = "unknown (runtime says " + std::to_string(blocks) + " blocks/SM, resources say " +
                std::to_string(o.blocks_per_sm) + ")";
    o.blocks_per_sm = blocks;
    const int warps_per_block = (k.block_threads + 31) / 32;
    o.theoretical_pct = 100.0 * blocks * warps_per_block / (dev.max_threads_per_sm / 32);
  }
  return o;
}

void to_json(nlohmann::json &j, const Occupancy &o) {
  j = nlohmann::json{{"kernel", o.kernel},
                     {"block_threads", o.block_threads},
                     {"registers", o.registers_per_thread},
                     {"smem_bytes", o.smem_per_block},
                     {"blocks_per_sm", o.blocks_per_sm},
                     {"theoretical_pct", o.theoretical_pct},
                     {"limiter", o.limiter},
                     {"blocks_by_limit", o.blocks_by_limit}};
}

// --------------------------------------------------------------------------------------------------- CUPTI

#if FLASHBENCH_WITH_CUPTI

namespace {

std::string cupti_message(CUptiResult r) {
  const char *s = nullptr;
  cuptiGetResultString(r, &s);
  std::string msg = s ? s : "unknown CUPTI error";
  switch (r) {
  case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES:
  case CUPTI_ERROR_VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES:
    msg += " (counters need admin rights or NVreg_RestrictProfilingToAdminUsers=0)";
    break;
  case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
    msg += " (another profiler is attached, e.g. ncu or nsys)";
    break;
  default:
    break;
  }
  return msg;
}

// Thrown inside the session for environment problems; caught and turned into a reason.
struct CuptiUnavailable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define FB_CUPTI_TRY(expr)                                                                         \
  do {                                                                                             \
    CUptiResult fb_r_ = (expr);                                                                    \
    if (fb_r_ != CUPTI_SUCCESS)                                                                    \
      throw CuptiUnavailable(std::string(#expr).substr(0, std::string(#expr).find('(')) + ": " +   \
                             cupti_message(fb_r_));                                                \
  } while (0)

CUcontext current_context() {
  using GetCtx = CUresult (*)(CUcontext *);
  void *fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  FB_CUDA_CHECK(
      cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess)
    throw CuptiUnavailable("cuCtxGetCurrent not found in the driver");
  CUcontext ctx = nullptr;
  if (reinterpret_cast<GetCtx>(fn)(&ctx) != CUDA_SUCCESS || !ctx)
    throw CuptiUnavailable("no current CUDA context");
  return ctx;
}

} // namespace

// Everything CUPTI holds lives between setup() and teardown(), and profile() runs the whole cycle for each point:
// with the profiler left initialised between points, later launches were seen to block the host and the worker to
// crash in the next profile pass; a fresh cycle per point (as the copy probe does) is the path seen to work.
struct CounterSession::Impl {
  int device = 0;
  CUcontext ctx = nullptr;
  std::string chip;
  std::vector<uint8_t> availability;
  std::vector<uint8_t> config;
  CUpti_Profiler_Host_Object *host = nullptr;
  std::vector<const char *> names;
  bool initialised = false;
  size_t passes = 0;

  // Throws CuptiUnavailable (environment) or UserError (unknown metric name).
  void setup() {
    FB_CUDA_CHECK(cudaSetDevice(device));
    FB_CUDA_CHECK(cudaFree(nullptr)); // make the primary context current
    ctx = current_context();
    CUpti_Profiler_Initialize_Params init{CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    FB_CUPTI_TRY(cuptiProfilerInitialize(&init));
    initialised = true;
    CUpti_Device_GetChipName_Params cn{CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    cn.deviceIndex = static_cast<size_t>(device);
    FB_CUPTI_TRY(cuptiDeviceGetChipName(&cn));
    chip = cn.pChipName;
    CUpti_Profiler_GetCounterAvailability_Params avail{
        CUpti_Profiler_GetCounterAvailability_Params_STRUCT_SIZE};
    avail.ctx = ctx;
    FB_CUPTI_TRY(cuptiProfilerGetCounterAvailability(&avail));
    availability.assign(avail.counterAvailabilityImageSize, 0);
    avail.pCounterAvailabilityImage = availability.data();
    FB_CUPTI_TRY(cuptiProfilerGetCounterAvailability(&avail));

    CUpti_Profiler_Host_Initialize_Params hi{CUpti_Profiler_Host_Initialize_Params_STRUCT_SIZE};
    hi.profilerType = CUPTI_PROFILER_TYPE_RANGE_PROFILER;
    hi.pChipName = chip.c_str();
    hi.pCounterAvailabilityImage = availability.data();
    FB_CUPTI_TRY(cuptiProfilerHostInitialize(&hi));
    host = hi.pHostObject;
    // Each name alone first, so an unknown one is named in the error (the user's to fix, not the environment's).
    for (const char *n : names) {
      CUpti_Profiler_Host_GetMetricProperties_Params prop{
          CUpti_Profiler_Host_GetMetricProperties_Params_STRUCT_SIZE};
      prop.pHostObject = host;
      prop.pMetricName = n;
      if (cuptiProfilerHostGetMetricProperties(&prop) != CUPTI_SUCCESS)
        throw UserError("unknown metric '" + std::string(n) + "' on chip " + chip +
                        "; list valid names with 'ncu --query-metrics --chip " + chip + "'");
    }
    CUpti_Profiler_Host_ConfigAddMetrics_Params add{
        CUpti_Profiler_Host_ConfigAddMetrics_Params_STRUCT_SIZE};
    add.pHostObject = host;
    add.ppMetricNames = names.data();
    add.numMetrics = names.size();
    FB_CUPTI_TRY(cuptiProfilerHostConfigAddMetrics(&add));
    CUpti_Profiler_Host_GetConfigImageSize_Params cs{
        CUpti_Profiler_Host_GetConfigImageSize_Params_STRUCT_SIZE};
    cs.pHostObject = host;
    FB_CUPTI_TRY(cuptiProfilerHostGetConfigImageSize(&cs));
    config.assign(cs.configImageSize, 0);
    CUpti_Profiler_Host_GetConfigImage_Params ci{
        CUpti_Profiler_Host_GetConfigImage_Params_STRUCT_SIZE};
    ci.pHostObject = host;
    ci.configImageSize = config.size();
    ci.pConfigImage = config.data();
    FB_CUPTI_TRY(cuptiProfilerHostGetConfigImage(&ci));
    CUpti_Profiler_Host_GetNumOfPasses_Params np{
        CUpti_Profiler_Host_GetNumOfPasses_Params_STRUCT_SIZE};
    np.configImageSize = config.size();
    np.pConfigImage = config.data();
    FB_CUPTI_TRY(cuptiProfilerHostGetNumOfPasses(&np));
    passes = np.numOfPasses;
  }

  void teardown() {
    if (host) {
      CUpti_Profiler_Host_Deinitialize_Params p{
          CUpti_Profiler_Host_Deinitialize_Params_STRUCT_SIZE};
      p.pHostObject = host;
      cuptiProfilerHostDeinitialize(&p);
      host = nullptr;
    }
    if (initialised) {
      CUpti_Profiler_DeInitialize_Params p{CUpti_Profiler_DeInitialize_Params_STRUCT_SIZE};
      cuptiProfilerDeInitialize(&p);
      initialised = false;
    }
  }

  ~Impl() { teardown(); }
};

CounterSession::CounterSession(const DeviceInfo &dev, std::vector<std::string> metrics)
    : impl_(std::make_unique<Impl>()), metrics_(std::move(metrics)) {
  if (const std::string &sim = env_options().simulate_cupti_failure; !sim.empty()) {
    reason_ = "simulated: " + sim;
    return;
  }
  if (!dev.present) {
    reason_ = "no CUDA device";
    return;
  }
  Impl &m = *impl_;
  m.device = dev.index;
  for (const auto &n : metrics_)
    m.names.push_back(n.c_str());
  try {
    m.setup(); // a dry cycle: availability, metric names and the pass count are known before any point runs
    passes_ = static_cast<int>(m.passes);
    available_ = true;
  } catch (const CuptiUnavailable &e) {
    reason_ = e.what();
  } catch (const CudaError &e) {
    reason_ = e.what();
  } catch (...) {
    m.teardown();
    throw;
  }
  m.teardown();
}

CounterSession::~CounterSession() = default;

Counters CounterSession::profile(const std::string & /*range_name: see PushRange*/,
                                 const std::function<void(cudaStream_t)> &launch,
                                 const std::function<void()> &flush, cudaStream_t stream) {
  Counters c;
  if (!available_) {
    c.reason = reason_;
    return c;
  }
  const auto t0 = std::chrono::steady_clock::now();
  Impl &m = *impl_;
  CUpti_RangeProfiler_Object *obj = nullptr;
  try {
    FB_CUDA_CHECK(cudaStreamSynchronize(stream));
    m.setup();
    CUpti_RangeProfiler_Enable_Params en{CUpti_RangeProfiler_Enable_Params_STRUCT_SIZE};
    en.ctx = m.ctx;
    FB_CUPTI_TRY(cuptiRangeProfilerEnable(&en));
    obj = en.pRangeProfilerObject;

    CUpti_RangeProfiler_GetCounterDataSize_Params ds{
        CUpti_RangeProfiler_GetCounterDataSize_Params_STRUCT_SIZE};
    ds.pRangeProfilerObject = obj;
    ds.pMetricNames = m.names.data();
    ds.numMetrics = m.names.size();
    ds.maxNumOfRanges = 1;
    ds.maxNumRangeTreeNodes = 2;
    FB_CUPTI_TRY(cuptiRangeProfilerGetCounterDataSize(&ds));
    std::vector<uint8_t> data(ds.counterDataSize);
    CUpti_RangeProfiler_CounterDataImage_Initialize_Params di{
        CUpti_RangeProfiler_CounterDataImage_Initialize_Params_STRUCT_SIZE};
    di.pRangeProfilerObject = obj;
    di.counterDataSize = data.size();
    di.pCounterData = data.data();
    FB_CUPTI_TRY(cuptiRangeProfilerCounterDataImageInitialize(&di));

    CUpti_RangeProfiler_SetConfig_Params sc{CUpti_RangeProfiler_SetConfig_Params_STRUCT_SIZE};
    sc.pRangeProfilerObject = obj;
    sc.configSize = m.config.size();
    sc.pConfig = m.config.data();
    sc.counterDataImageSize = data.size();
    sc.pCounterDataImage = data.data();
    sc.range = CUPTI_UserRange;
    sc.replayMode = CUPTI_UserReplay;
    sc.maxRangesPerPass = 1;
    sc.numNestingLevels = 1;
    sc.minNestingLevel = 1;
    sc.passIndex = 0;
    sc.targetNestingLevel = 1;
    FB_CUPTI_TRY(cuptiRangeProfilerSetConfig(&sc));

    int pass = 0;
    for (bool all_submitted = false; !all_submitted; ++pass) {
      if (pass > 64)
        throw CuptiUnavailable("metric collection did not finish within 64 passes");
      flush();
      FB_CUDA_CHECK(cudaStreamSynchronize(stream));
      CUpti_RangeProfiler_Start_Params st{CUpti_RangeProfiler_Start_Params_STRUCT_SIZE};
      st.pRangeProfilerObject = obj;
      FB_CUPTI_TRY(cuptiRangeProfilerStart(&st));
      CUpti_RangeProfiler_PushRange_Params push{CUpti_RangeProfiler_PushRange_Params_STRUCT_SIZE};
      push.pRangeProfilerObject = obj;
      // CUPTI reads '/' in a range name as nesting, which overflowed its one-node range tree (a crash in
      // DecodeData): the range gets a plain name; the point's own name is on its NVTX range.
      push.pRangeName = "flashbench_point";
      FB_CUPTI_TRY(cuptiRangeProfilerPushRange(&push));
      launch(stream);
      FB_CHECK_LAUNCH();
      CUpti_RangeProfiler_PopRange_Params pop{CUpti_RangeProfiler_PopRange_Params_STRUCT_SIZE};
      pop.pRangeProfilerObject = obj;
      FB_CUPTI_TRY(cuptiRangeProfilerPopRange(&pop));
      CUpti_RangeProfiler_Stop_Params sp{CUpti_RangeProfiler_Stop_Params_STRUCT_SIZE};
      sp.pRangeProfilerObject = obj;
      FB_CUPTI_TRY(cuptiRangeProfilerStop(&sp));
      FB_CUDA_CHECK(cudaStreamSynchronize(stream));
      all_submitted = sp.isAllPassSubmitted != 0;
    }
    c.passes = pass;
    CUpti_RangeProfiler_DecodeData_Params dec{CUpti_RangeProfiler_DecodeData_Params_STRUCT_SIZE};
    dec.pRangeProfilerObject = obj;
    FB_CUPTI_TRY(cuptiRangeProfilerDecodeData(&dec));
    if (dec.numOfRangeDropped)
      c.untrusted.push_back(std::to_string(dec.numOfRangeDropped) + " range(s) dropped");

    CUpti_RangeProfiler_GetCounterDataInfo_Params info{
        CUpti_RangeProfiler_GetCounterDataInfo_Params_STRUCT_SIZE};
    info.pCounterDataImage = data.data();
    info.counterDataImageSize = data.size();
    FB_CUPTI_TRY(cuptiRangeProfilerGetCounterDataInfo(&info));
    if (info.numTotalRanges < 1)
      throw CuptiUnavailable("the profiler recorded no range");
    std::vector<double> values(m.names.size(), NAN);
    CUpti_Profiler_Host_EvaluateToGpuValues_Params ev{
        CUpti_Profiler_Host_EvaluateToGpuValues_Params_STRUCT_SIZE};
    ev.pHostObject = m.host;
    ev.pCounterDataImage = data.data();
    ev.counterDataImageSize = data.size();
    ev.rangeIndex = 0;
    ev.ppMetricNames = m.names.data();
    ev.numMetrics = m.names.size();
    ev.pMetricValues = values.data();
    FB_CUPTI_TRY(cuptiProfilerHostEvaluateToGpuValues(&ev));
    for (size_t i = 0; i < m.names.size(); ++i) {
      c.values[m.names[i]] = values[i];
      const std::string n = m.names[i];
      if (n.find(".pct") != std::string::npos && values[i] > 100.5)
        c.untrusted.push_back(n + ": " + std::to_string(values[i]) + "% is over 100%");
      if (!std::isfinite(values[i]))
        c.untrusted.push_back(n + ": not a number");
    }
    c.available = true;
  } catch (const CuptiUnavailable &e) {
    c.reason = e.what();
  }
  if (obj) {
    CUpti_RangeProfiler_Disable_Params dis{CUpti_RangeProfiler_Disable_Params_STRUCT_SIZE};
    dis.pRangeProfilerObject = obj;
    cuptiRangeProfilerDisable(&dis);
  }
  m.teardown();
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

#else // built without CUPTI

struct CounterSession::Impl {};

CounterSession::CounterSession(const DeviceInfo &, std::vector<std::string> metrics)
    : impl_(std::make_unique<Impl>()), metrics_(std::move(metrics)) {
  reason_ = "flashbench was built without CUPTI (FLASHBENCH_WITH_CUPTI=OFF)";
}
CounterSession::~CounterSession() = default;
Counters CounterSession::profile(const std::string &, const std::function<void(cudaStream_t)> &,
                                 const std::function<void()> &, cudaStream_t) {
  Counters c;
  c.reason = reason_;
  return c;
}

#endif

} // namespace fb
