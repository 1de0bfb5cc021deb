#include "core/autotuner.h"

namespace hvdl {

Autotuner::Autotuner(const TuneParams& initial, bool tune_algorithm, int warmup_samples,
                     int steps_per_sample, const std::string& log_path)
    : current_(initial),
      best_(initial),
      tune_algorithm_(tune_algorithm),
      warmup_(warmup_samples),
      steps_(steps_per_sample < 1 ? 1 : steps_per_sample) {
  if (!tune_algorithm_) phase_ = 1;
  if (!log_path.empty()) {
    log_ = std::fopen(log_path.c_str(), "w");
    if (log_ != nullptr) {
      std::fprintf(log_, "sample,phase,fusion_threshold_bytes,cycle_time_ms,algorithm,bytes,"
                         "seconds,throughput_bytes_per_s,best_throughput_bytes_per_s\n");
      std::fflush(log_);
    }
  }
  std::vector<TuneParams> first = Candidates(phase_);
  current_ = first.front();
}

Autotuner::~Autotuner() {
  if (log_ != nullptr) std::fclose(log_);
}

std::vector<TuneParams> Autotuner::Candidates(int phase) const {
  std::vector<TuneParams> out;
  TuneParams p = best_;
  if (phase == 0) {
    for (AllreduceAlgorithm a : {AllreduceAlgorithm::kMpi, AllreduceAlgorithm::kRing}) {
      p.algorithm = a;
      out.push_back(p);
    }
  } else if (phase == 1) {
    for (int64_t mib : {1, 4, 16, 64, 128}) {
      p.fusion_threshold_bytes = mib * 1024 * 1024;
      out.push_back(p);
    }
  } else {
    for (double ms : {0.1, 0.5, 1.0, 2.5, 5.0}) {
      p.cycle_time_ms = ms;
      out.push_back(p);
    }
  }
  return out;
}

bool Autotuner::Record(int64_t bytes, std::chrono::steady_clock::time_point now) {
  if (converged() || bytes <= 0) return false;
  if (steps_in_sample_ == 0) sample_start_ = now;
  sample_bytes_ += bytes;
  if (++steps_in_sample_ < steps_) return false;
  const double seconds = std::chrono::duration<double>(now - sample_start_).count();
  const double score = seconds > 0 ? static_cast<double>(sample_bytes_) / seconds : 0.0;
  const bool measured = sample_in_candidate_ >= warmup_;
  if (measured) Log(static_cast<double>(sample_bytes_), seconds, score);
  steps_in_sample_ = 0;
  sample_bytes_ = 0;
  if (!measured) {
    ++sample_in_candidate_;
    return false;
  }
  TuneParams before = current_;
  Advance(score);
  return !(current_ == before) || converged();
}

// One measured sample of the current candidate is done: remember it if best, move on.
void Autotuner::Advance(double score) {
  if (score > best_score_) {
    best_score_ = score;
    best_ = current_;
  }
  sample_in_candidate_ = 0;
  std::vector<TuneParams> candidates = Candidates(phase_);
  if (++candidate_ < candidates.size()) {
    current_ = candidates[candidate_];
    return;
  }
  // Phase done: keep its best and start the next grid from it.
  ++phase_;
  candidate_ = 0;
  best_score_ = -1;  // the next phase compares its own candidates
  current_ = phase_ < kPhases ? Candidates(phase_).front() : best_;
}

void Autotuner::Log(double bytes, double seconds, double score) {
  if (log_ == nullptr) return;
  std::fprintf(log_, "%d,%d,%lld,%g,%s,%.0f,%.6f,%.0f,%.0f\n", ++sample_index_, phase_,
               static_cast<long long>(current_.fusion_threshold_bytes), current_.cycle_time_ms,
               AllreduceAlgorithmName(current_.algorithm), bytes, seconds, score,
               score > best_score_ ? score : best_score_);
  std::fflush(log_);
}

}  // namespace hvdl
