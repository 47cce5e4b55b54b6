#include "flashbench/timing.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace fb {

void to_json(nlohmann::json& j, const TimingPolicy& t) {
  j = nlohmann::json{{"min_samples", t.min_samples}, {"max_noise", t.max_noise},
                     {"min_time_s", t.min_time_s},   {"timeout_s", t.timeout_s},
                     {"max_samples", t.max_samples}, {"cold", t.cold}, {"flush", t.flush},
                     {"warmup_runs", t.warmup_runs}, {"throttle_fraction", t.throttle_fraction},
                     {"point_timeout_s", t.point_timeout_s}, {"settle_s", t.settle_s}};
}

double StoppingRule::relative_stddev() const {
  const double n = static_cast<double>(samples_.size());
  if (n < 2) return INFINITY;
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
  if (samples_us.empty()) return t;
  std::sort(samples_us.begin(), samples_us.end());
  const size_t n = samples_us.size();
  t.median_us = n % 2 ? samples_us[n / 2] : 0.5 * (samples_us[n / 2 - 1] + samples_us[n / 2]);
  t.min_us = samples_us.front();
  t.max_us = samples_us.back();
  double sum = 0, sum_sq = 0;
  for (double s : samples_us) sum += s;
  t.mean_us = sum / n;
  for (double s : samples_us) sum_sq += (s - t.mean_us) * (s - t.mean_us);
  t.cv = n > 1 && t.mean_us > 0 ? std::sqrt(sum_sq / (n - 1)) / t.mean_us : 0.0;
  return t;
}

} // namespace fb
