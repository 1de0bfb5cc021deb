#include "common/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

namespace hvdl {
namespace {

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Status Invalid(const std::string& name, const std::string& value, const std::string& wanted) {
  return Status::InvalidArgument("invalid value for " + name + ": '" + value + "' (expected " +
                                 wanted + ")");
}

Status ParseInt(const std::string& name, const std::string& v, int64_t min, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < min) {
    return Invalid(name, v, "an integer >= " + std::to_string(min));
  }
  *out = x;
  return Status::Ok();
}

Status ParseDouble(const std::string& name, const std::string& v, double min, double* out) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || errno != 0 || !(x >= min)) {
    return Invalid(name, v, "a number >= " + std::to_string(min));
  }
  *out = x;
  return Status::Ok();
}

Status ParseBool(const std::string& name, const std::string& v, bool* out) {
  std::string s = Lower(v);
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    *out = true;
  } else if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) {
    *out = false;
  } else {
    return Invalid(name, v, "one of 1, 0, true, false, yes, no, on, off");
  }
  return Status::Ok();
}

Status ParseToggle(const std::string& name, const std::string& v, Toggle* out) {
  if (Lower(v) == "auto") {
    *out = Toggle::kAuto;
    return Status::Ok();
  }
  bool on = false;
  if (!ParseBool(name, v, &on).ok()) return Invalid(name, v, "auto, 1 or 0 (true/false, ...)");
  *out = on ? Toggle::kOn : Toggle::kOff;
  return Status::Ok();
}

Status ParseLogLevel(const std::string& name, const std::string& v, LogLevel* out) {
  static const std::pair<const char*, LogLevel> kLevels[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},
      {"warning", LogLevel::kWarning}, {"warn", LogLevel::kWarning}, {"error", LogLevel::kError},
      {"fatal", LogLevel::kFatal}};
  for (const auto& [text, level] : kLevels) {
    if (Lower(v) == text) {
      *out = level;
      return Status::Ok();
    }
  }
  return Invalid(name, v, "one of trace, debug, info, warning, error, fatal");
}

Status ParseAlgorithm(const std::string& name, const std::string& v, AllreduceAlgorithm* out) {
  std::string s = Lower(v);
  if (s == "auto") *out = AllreduceAlgorithm::kAuto;
  else if (s == "mpi") *out = AllreduceAlgorithm::kMpi;
  else if (s == "ring") *out = AllreduceAlgorithm::kRing;
  else return Invalid(name, v, "one of auto, mpi, ring");
  return Status::Ok();
}

Status ParseGpuOperations(const std::string& name, const std::string& v, GpuOperations* out) {
  std::string s = Lower(v);
  if (s == "nccl") *out = GpuOperations::kNccl;
  else if (s == "mpi") *out = GpuOperations::kMpi;
  else return Invalid(name, v, "one of nccl, mpi");
  return Status::Ok();
}

// One row per knob: its documentation and how it lands in Config.
struct Knob {
  KnobInfo info;
  std::function<Status(const std::string& name, const std::string& value, Config* c)> parse;
};

const std::vector<Knob>& Table() {
  static const std::vector<Knob> kTable = {
      {{"HOROVOD_FUSION_THRESHOLD", "134217728",
        "Bytes of ready allreduces packed into one fused collective (0 disables fusion)."},
       [](auto& n, auto& v, Config* c) { return ParseInt(n, v, 0, &c->fusion_threshold_bytes); }},
      {{"HOROVOD_CYCLE_TIME", "10",
        "Milliseconds the background thread may hold new tensors back to fuse them while no "
        "thread waits on a handle (training is still computing); a thread starting to wait ends "
        "the hold at once, so a waited-for tensor is sent after a short quiet gap."},
       [](auto& n, auto& v, Config* c) { return ParseDouble(n, v, 0.0, &c->cycle_time_ms); }},
      {{"HOROVOD_HOLD_UNTIL_WAIT", "auto",
        "1: hold new tensors (up to 100 ms, at least the cycle time) until a thread waits on a "
        "handle (synchronize, or poll of an unfinished one), so a training step's gradients go "
        "out as one batch when backward is done instead of in pieces that take CPU from it "
        "(a ready gradient bucket still goes out at once: HOROVOD_BUCKET_SEND_NOW). auto: when "
        "this host runs at least as many ranks as it has usable CPUs; 0: never."},
       [](auto& n, auto& v, Config* c) { return ParseToggle(n, v, &c->hold_until_wait); }},
      {{"HOROVOD_BIND_RANKS", "0",
        "Pin each rank (the thread that calls init, and the threads and processes it starts "
        "afterwards: the background thread, torch's pool, DataLoader workers, other libraries' "
        "threads) to one CPU, local rank i to the i-th CPU the process may use. auto: when this "
        "host runs exactly as many ranks as those CPUs; 1: always (rank i to CPU i mod n); 0: "
        "never. Unpinned, the kernel sometimes runs two ranks' threads on one CPU while another "
        "idles for a while (measured after gloo's threads had run in the process); pinned, "
        "everything started later shares the rank's CPU (gloo's 200-tensor case ran 3x "
        "slower). Linux."},
       [](auto& n, auto& v, Config* c) { return ParseToggle(n, v, &c->bind_ranks); }},
      {{"HOROVOD_CACHE_CAPACITY", "1024",
        "Negotiated names remembered by the response cache (0 disables it)."},
       [](auto& n, auto& v, Config* c) { return ParseInt(n, v, 0, &c->cache_capacity); }},
      {{"HOROVOD_LOG_LEVEL", "warning", "One of trace, debug, info, warning, error, fatal."},
       [](auto& n, auto& v, Config* c) { return ParseLogLevel(n, v, &c->log_level); }},
      {{"HOROVOD_LOG_HIDE_TIME", "0", "Omit timestamps from log lines."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->log_hide_time); }},
      {{"HOROVOD_TIMELINE", "", "Write a Chrome-trace timeline to this file (rank 0)."},
       [](auto&, auto& v, Config* c) { c->timeline_path = v; return Status::Ok(); }},
      {{"HOROVOD_TIMELINE_MARK_CYCLES", "0", "Mark background-loop cycles in the timeline."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->timeline_mark_cycles); }},
      {{"HOROVOD_STALL_CHECK_TIME_SECONDS", "60",
        "Seconds a tensor may wait for other ranks before a stall warning names them."},
       [](auto& n, auto& v, Config* c) { return ParseDouble(n, v, 0.0, &c->stall_check_seconds); }},
      {{"HOROVOD_STALL_CHECK_DISABLE", "0", "Turn the stall inspector off."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->stall_check_disable); }},
      {{"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0",
        "Seconds after which a stall becomes an error on every rank (0: warn only)."},
       [](auto& n, auto& v, Config* c) {
         return ParseDouble(n, v, 0.0, &c->stall_shutdown_seconds);
       }},
      {{"HOROVOD_AUTOTUNE", "0", "Tune fusion threshold, cycle time and algorithm online."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->autotune); }},
      {{"HOROVOD_AUTOTUNE_LOG", "", "CSV file where autotune logs each trial (rank 0)."},
       [](auto&, auto& v, Config* c) { c->autotune_log = v; return Status::Ok(); }},
      {{"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3",
        "Autotune samples discarded for each candidate before one is measured."},
       [](auto& n, auto& v, Config* c) { return ParseInt(n, v, 0, &c->autotune_warmup_samples); }},
      {{"HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10",
        "Background-loop cycles that moved allreduce data per autotune sample."},
       [](auto& n, auto& v, Config* c) {
         return ParseInt(n, v, 1, &c->autotune_steps_per_sample);
       }},
      {{"HOROVOD_DYNAMIC_PROCESS_SETS", "0", "Allow add_process_set/remove_process_set."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->dynamic_process_sets); }},
      {{"HOROVOD_SUMMARY_STEPS", "0",
        "Print a per-rank performance summary every N steps (0: never)."},
       [](auto& n, auto& v, Config* c) { return ParseInt(n, v, 0, &c->summary_steps); }},
      {{"HOROVOD_ALLREDUCE_ALGO", "auto",
        "auto (see the algorithm choice below), mpi (MPI_Allreduce) or ring (horovodlite's "
        "zero-copy ring)."},
       [](auto& n, auto& v, Config* c) { return ParseAlgorithm(n, v, &c->allreduce_algorithm); }},
      {{"HOROVOD_RING_THRESHOLD", "auto",
        "Bytes from which auto also runs a single tensor as a ring (-1: never; auto: 8 MiB in a "
        "job on one host with HOROVOD_RING_CMA, never otherwise; fused batches from 256 KiB "
        "and floating sums on 3+ ranks always use the ring)."},
       [](auto& n, auto& v, Config* c) {
         if (v == "auto") {
           c->ring_threshold_bytes = Config::kRingThresholdAuto;
           return Status::Ok();
         }
         return ParseInt(n, v, -1, &c->ring_threshold_bytes);
       }},
      {{"HOROVOD_RING_SEGMENT_BYTES", "auto",
        "Pipeline segment of the ring: one segment is reduced while the next is in flight. "
        "auto: 256 KiB between ranks of one host; on rings that cross hosts 64 KiB over MPI "
        "(its TCP sends that much without a handshake) and 1 MiB over Gloo (each message a "
        "handshake)."},
       [](auto& n, auto& v, Config* c) {
         if (Lower(v) == "auto") {
           c->ring_segment_bytes = 0;
           return Status::Ok();
         }
         return ParseInt(n, v, 1024, &c->ring_segment_bytes);
       }},
      {{"HOROVOD_RING_CMA", "1",
        "Ring messages between processes on one host are copied once, straight from the "
        "sender's tensors (Linux process_vm_readv), when the kernel allows it; 0: MPI messages."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->ring_single_copy); }},
      {{"HOROVOD_MALLOC_TUNING", "1",
        "At init, keep freed memory for reuse instead of returning it to the kernel (glibc: "
        "allocations up to 32 MiB from the heap, trim above 256 MiB free), so tensors allocated "
        "every step stop costing page faults; horovodliterun also puts the ranks' heap on "
        "transparent huge pages (GLIBC_TUNABLES). Not when MALLOC_MMAP_THRESHOLD_, "
        "MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES is set. 0: leave the allocator alone."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->malloc_tuning); }},
      {{"HOROVOD_HIERARCHICAL_ALLREDUCE", "auto",
        "Allreduce inside each host first, then across hosts, then inside the host again; needs "
        "the same number of ranks on every host, and several hosts. 1: every allreduce of the "
        "global set (CPU and NCCL); auto: on CPU, wherever the algorithm choice below runs the "
        "ring; 0: never. On the controller without MPI it also decides CPU reducescatters of "
        "the global set (inside each host, then across hosts; auto: from 256 KiB)."},
       [](auto& n, auto& v, Config* c) { return ParseToggle(n, v, &c->hierarchical_allreduce); }},
      {{"HOROVOD_HIERARCHICAL_ALLGATHER", "auto",
        "CPU allgathers of the global set exchange each rank's block across hosts once per "
        "host (between ranks of equal local rank), then share them inside each host; same "
        "conditions as above, on MPI and on the controller without MPI alike. 1: whenever "
        "possible; auto: from 256 KiB gathered in all; 0: one allgather over all ranks "
        "(MPI_Allgatherv, or the ring)."},
       [](auto& n, auto& v, Config* c) { return ParseToggle(n, v, &c->hierarchical_allgather); }},
      {{"HOROVOD_GPU_OPERATIONS", "nccl",
        "CUDA tensors: nccl (NCCL when built, else host staging) or mpi (always through host "
        "memory and MPI; lets several ranks share one GPU). Same value on every rank."},
       [](auto& n, auto& v, Config* c) { return ParseGpuOperations(n, v, &c->gpu_operations); }},
      {{"HOROVOD_STAGING_CHUNK_BYTES", "4194304",
        "CUDA tensors through host memory (HOROVOD_GPU_OPERATIONS=mpi, or no NCCL): a larger "
        "allreduce or broadcast is cut into chunks of this size, and one chunk is reduced on the "
        "host while the next is copied off the device and the one before is copied back (pinned "
        "buffers, one stream). 0: one piece (copy all, reduce, copy all back). Same value on "
        "every rank."},
       [](auto& n, auto& v, Config* c) { return ParseInt(n, v, 0, &c->staging_chunk_bytes); }},
      {{"HOROVOD_GPU_COMPLETION", "stream",
        "CUDA tensors: when a handle completes. stream: once the collective is queued on "
        "horovodlite's stream (synchronize makes the caller's stream wait for it, as DDP "
        "does): the host never waits for the GPU, and a failure the device reports later fails "
        "the next GPU collective, naming the one that failed. host: once the device has run "
        "the collective (the background thread waits for it, so a failure reaches the op's own "
        "handle; ResNet-50 on one H100 ran at 88-91 % of plain torch under host, 98-100 % under "
        "stream). HOROVOD_AUTOTUNE (which times collectives) keeps host."},
       [](auto& n, auto& v, Config* c) {
         const std::string mode = Lower(v);
         if (mode != "host" && mode != "stream") {
           return Invalid(n, v, "host or stream");
         }
         c->gpu_stream_completion = mode == "stream";
         return Status::Ok();
       }},
      {{"HOROVOD_WAIT_SPIN_US", "auto",
        "Microseconds a thread waiting on a handle (synchronize) spins, yielding the CPU, before "
        "it sleeps: a completion seen while spinning costs no wake-up (10-20 us on a small VM). "
        "auto: 50 when this host runs fewer ranks than it has usable CPUs (a spare core for the "
        "background thread), else 0 (a spinning waiter would take the core the background "
        "threads need); 0: sleep at once."},
       [](auto& n, auto& v, Config* c) {
         if (Lower(v) == "auto") {
           c->wait_spin_us = -1;
           return Status::Ok();
         }
         return ParseInt(n, v, 0, &c->wait_spin_us);
       }},
      {{"HOROVOD_NATIVE_GRADIENT_HOOKS", "1",
        "DistributedOptimizer hooks each dense gradient in C++ and enqueues its allreduce there "
        "(no Python per gradient); 0: a Python hook per gradient, as before (for compiled "
        "autograd, which cannot trace C++ hooks). Read when the optimizer is built."},
       [](auto& n, auto& v, Config* c) { return ParseBool(n, v, &c->native_gradient_hooks); }},
  };
  return kTable;
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

Status ParseConfig(const EnvLookup& env, Config* out) {
  Config c;
  for (const Knob& knob : Table()) {
    std::optional<std::string> value = env(knob.info.name);
    if (value) HVDL_RETURN_IF_ERROR(knob.parse(knob.info.name, *value, &c));
  }
  *out = c;
  return Status::Ok();
}

const std::vector<KnobInfo>& Knobs() {
  static const std::vector<KnobInfo> kInfos = [] {
    std::vector<KnobInfo> infos;
    for (const Knob& knob : Table()) infos.push_back(knob.info);
    return infos;
  }();
  return kInfos;
}

const char* AllreduceAlgorithmName(AllreduceAlgorithm algo) {
  switch (algo) {
    case AllreduceAlgorithm::kAuto: return "auto";
    case AllreduceAlgorithm::kMpi: return "mpi";
    case AllreduceAlgorithm::kRing: return "ring";
  }
  return "?";
}

const char* GpuOperationsName(GpuOperations ops) {
  return ops == GpuOperations::kNccl ? "nccl" : "mpi";
}

}  // namespace hvdl
