// Autotuner: chooses fusion threshold, cycle time and allreduce algorithm online from measured
// throughput (HOROVOD_AUTOTUNE=1). Runs on rank 0 only; every rank applies the parameters it
// decides at the same cycle, because they travel in the coordinator's response list.
//
// Method: coordinate search over small grids, one parameter at a time (algorithm, then fusion
// threshold, then cycle time), keeping the best value of each before moving on. A sample is
// HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE cycles that moved allreduce data; its score is bytes per
// second of wall time between the first and last of those cycles. The first
// HOROVOD_AUTOTUNE_WARMUP_SAMPLES samples of each candidate are discarded. Once every grid is
// done the tuner has converged and the best parameters stay. Each measured sample is one CSV row
// in HOROVOD_AUTOTUNE_LOG.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/config.h"

namespace hvdl {

struct TuneParams {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  bool operator==(const TuneParams& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes &&
           cycle_time_ms == o.cycle_time_ms && algorithm == o.algorithm;
  }
};

class Autotuner {
 public:
  // `initial` is the configured starting point; `tune_algorithm` is false when the user fixed
  // HOROVOD_ALLREDUCE_ALGO. `log_path` may be empty.
  Autotuner(const TuneParams& initial, bool tune_algorithm, int warmup_samples,
            int steps_per_sample, const std::string& log_path);
  ~Autotuner();

  // Reports one cycle that moved `bytes` of allreduce payload. Returns true when the tuner wants
  // new parameters applied (then read them with params()).
  bool Record(int64_t bytes, std::chrono::steady_clock::time_point now);
  const TuneParams& params() const { return current_; }
  bool converged() const { return phase_ >= kPhases; }

 private:
  static constexpr int kPhases = 3;
  std::vector<TuneParams> Candidates(int phase) const;
  void Advance(double score);
  void Log(double bytes, double seconds, double score);

  TuneParams current_, best_;
  double best_score_ = -1;
  bool tune_algorithm_;
  int warmup_, steps_;
  int phase_ = 0;
  size_t candidate_ = 0;
  int sample_in_candidate_ = 0;
  int steps_in_sample_ = 0;
  int64_t sample_bytes_ = 0;
  std::chrono::steady_clock::time_point sample_start_;
  int sample_index_ = 0;
  std::FILE* log_ = nullptr;
};

}  // namespace hvdl
