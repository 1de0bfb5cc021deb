// Config: every knob horovodlite reads, parsed once at init from HOROVOD_* environment variables.
//
// The table in config.cc is the single home of names, defaults and documentation; the Python
// package exposes it (hvd._knobs()) and a test checks that the README table lists every knob.
// An invalid value fails init with a message naming the variable and what it accepts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status.h"

namespace hvdl {

enum class AllreduceAlgorithm { kAuto = 0, kMpi, kRing };

// How collectives on CUDA tensors move data: NCCL (when built) or host staging through MPI.
enum class GpuOperations { kNccl = 0, kMpi };

// A feature that is on, off, or chosen where it helps (HOROVOD_HIERARCHICAL_*).
enum class Toggle { kAuto = 0, kOff, kOn };

struct Config {
  int64_t fusion_threshold_bytes = 128LL * 1024 * 1024;
  double cycle_time_ms = 10.0;
  LogLevel log_level = LogLevel::kWarning;
  bool log_hide_time = false;
  int64_t cache_capacity = 1024;
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  double stall_check_seconds = 60.0;
  bool stall_check_disable = false;
  double stall_shutdown_seconds = 0.0;
  bool autotune = false;
  std::string autotune_log;
  int64_t autotune_warmup_samples = 3;
  int64_t autotune_steps_per_sample = 10;
  bool dynamic_process_sets = false;
  int64_t summary_steps = 0;
  AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::kAuto;
  // Single tensors from this many bytes run as a ring; -1: never; kRingThresholdAuto: the
  // planner decides from the job's layout (comm/allreduce_planner).
  static constexpr int64_t kRingThresholdAuto = -2;
  int64_t ring_threshold_bytes = kRingThresholdAuto;
  int64_t ring_segment_bytes = 0;  // 0: auto (per ring, see backends/mpi)
  bool ring_single_copy = true;
  bool malloc_tuning = true;
  Toggle hold_until_wait = Toggle::kAuto;
  Toggle bind_ranks = Toggle::kOff;
  Toggle hierarchical_allreduce = Toggle::kAuto;
  Toggle hierarchical_allgather = Toggle::kAuto;
  GpuOperations gpu_operations = GpuOperations::kNccl;
  int64_t staging_chunk_bytes = 4LL << 20;  // host staging's pipeline chunk; 0: one piece
  bool gpu_stream_completion = true;   // HOROVOD_GPU_COMPLETION=stream (core/device_inflight.h)
  bool native_gradient_hooks = true;
  int64_t wait_spin_us = -1;  // -1: auto (see the knob)
};

struct KnobInfo {
  std::string name;
  std::string default_value;
  std::string doc;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// Reads the process environment.
EnvLookup ProcessEnv();

// Parses every knob through `env`; unset variables keep their defaults.
Status ParseConfig(const EnvLookup& env, Config* out);

// The documented table (name, default, meaning), in the order the README lists it.
const std::vector<KnobInfo>& Knobs();

const char* AllreduceAlgorithmName(AllreduceAlgorithm algo);
const char* GpuOperationsName(GpuOperations ops);

}  // namespace hvdl
