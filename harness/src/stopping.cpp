#include "flashbench/timing.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace fb {

void to_json(nlohmann::json &j, const TimingPolicy &t) {
  j = nlohmann::json{{"min_samples", t.min_samples},
                     {"max_noise", t.max_noise},
                     {"min_time_s", t.min_time_s},
                     {"timeout_s", t.timeout_s},
                     {"max_samples", t.max_samples},
                     {"cold", t.cold},
                     {"flush", t.flush},
                     {"warmup_runs", t.warmup_runs},
                     {"throttle_fraction", t.throttle_fraction},
                     {"point_timeout_s", t.point_timeout_s},
                     {"settle_s", t.settle_s},
                     {"queue", t.queue}};
}

double StoppingRule::relative_stddev() const {
  const double n = static_cast<double>(samples_.size());
  if (n < 2)
    return INFINITY;
  const double mean = sum_ / n;
  const double var = std::max(0.0, (sum_sq_ - n * mean * mean) / (n - 1));
  return mean > 0 ? std::sqrt(var) / mean : INFINITY;
}

bool StoppingRule::add(double sample_us, double wall_s) {
  samples_.push_back(sample_us);
  sum_ += sample_us;
  sum_sq_ += sample_us * sample_us;
  gpu_time_s_ += sample_us * 1e-6;
  const int n = static_cast<int>(samples_.size());
  if (n >= policy_.max_samples) {
    reason_ = "max_samples";
    return true;
  }
  if (n >= policy_.min_samples && gpu_time_s_ >= policy_.min_time_s &&
      relative_stddev() <= policy_.max_noise) {
    reason_ = "noise";
    return true;
  }
  if (timed_out(wall_s) && n >= std::min(policy_.min_samples, 3)) {
    reason_ = "timeout";
    return true;
  }
  return false;
}

TimingStats summarize(std::vector<double> samples_us) {
  TimingStats t;
  t.samples_us = samples_us;
  if (samples_us.empty())
    return t;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  t.median_us = n % 2 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  t.min_us = samples_us.front();
  t.max_us = samples_us.back();
  double sum = 0, sum_sq = 0;
  for (double s : samples_us)
    sum += s;
  t.mean_us = sum / n;
  for (double s : samples_us)
    sum_sq += (s - t.mean_us) * (s - t.mean_us);
  t.cv = n > 1 && t.mean_us > 0 ? std::sqrt(sum_sq / (n - 1)) / t.mean_us : 0.0;
  return t;
}

TimingStats sample_loop(const std::function<SampleBatch()> &next,
                        const std::function<int()> &clock_mhz, int max_mhz,
                        const TimingPolicy &policy, const std::function<double()> &now_s) {
  StoppingRule rule(policy);
  std::vector<double> clocks;
  int dropped = 0, void_batches = 0;
  double busy_us =
      0; // every timed sample's GPU time, dropped and void ones included: the load on the GPU
  const double t0 = now_s();
  for (bool done = false; !done;) {
    const SampleBatch b = next();
    for (double us : b.us)
      busy_us += us;
    const double wall = now_s() - t0;
    if (b.is_void) {
      ++void_batches;
      if (rule.timed_out(wall) && rule.samples().size() >= 3)
        break;
      if (rule.timed_out(wall * 0.5) && rule.samples().empty() && void_batches >= 8)
        throw std::runtime_error("every batch of samples was void (queue '" + policy.queue +
                                 "': the host could not keep the GPU's queue as the policy asks)");
      continue;
    }
    const int mhz = clock_mhz ? clock_mhz() : 0;
    if (mhz > 0 && max_mhz > 0 && mhz < policy.throttle_fraction * max_mhz) {
      dropped += static_cast<int>(
          b.us.size()); // throttled: these say more about the clock than the kernel
      if (rule.timed_out(wall) && rule.samples().size() >= 3)
        break;
      if (rule.timed_out(wall * 0.5) && rule.samples().empty())
        throw std::runtime_error("every sample was throttled below " +
                                 std::to_string(static_cast<int>(policy.throttle_fraction * 100)) +
                                 "% of the maximum SM clock");
      continue;
    }
    for (double us : b.us) {
      if (mhz > 0)
        clocks.push_back(mhz);
      if (rule.add(us, wall)) {
        done = true;
        break;
      }
    }
  }
  TimingStats t = summarize(rule.samples());
  t.dropped_throttled = dropped;
  t.void_batches = void_batches;
  t.stop_reason = rule.reason().empty() ? "timeout" : rule.reason();
  t.noisy = t.cv > policy.max_noise;
  t.wall_s = now_s() - t0;
  if (t.wall_s > 0)
    t.busy_fraction = busy_us * 1e-6 / t.wall_s;
  if (!clocks.empty()) {
    std::nth_element(clocks.begin(), clocks.begin() + clocks.size() / 2, clocks.end());
    t.sm_clock_mhz = clocks[clocks.size() / 2];
  }
  return t;
}

} // namespace fb
