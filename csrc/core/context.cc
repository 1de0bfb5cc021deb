#include "core/context.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/logging.h"
#include "core/affinity.h"
#include "core/launcher_watch.h"

namespace hvdl {

// Feeds execution events to the timeline (rank 0) and the performance summary.
class Context::Observer : public ExecutionObserver {
 public:
  explicit Observer(Context* ctx) : ctx_(ctx) {}
  bool Recording() const override { return ctx_->timeline_->enabled(); }
  void Begin() override { ctx_->timeline_->BeginBatch(); }
  void Member(const std::string& name, int32_t process_set) override {
    ctx_->timeline_->BatchMember(name, process_set);
  }
  void Activity(const char* activity) override { ctx_->timeline_->Activity(activity); }
  void Done() override { ctx_->timeline_->Done(); }
  void CollectiveDone(OpType op, int tensors, int64_t bytes, int n, double seconds) override {
    const double factor = n <= 1 ? 0.0
                          : op == OpType::kAllreduce ? 2.0 * (n - 1) / n
                                                     : static_cast<double>(n - 1) / n;
    std::lock_guard<std::mutex> lock(ctx_->stats_mu_);
    SummaryStats& s = ctx_->summary_;
    ++s.collectives;
    s.tensors += static_cast<uint64_t>(tensors);
    s.bytes += bytes;
    s.bus_bytes += static_cast<double>(bytes) * factor;
    s.collective_seconds += seconds;
    if (tensors > 1) {
      ++s.fused_batches;
      s.fused_bytes += bytes;
    }
  }

 private:
  Context* ctx_;
};

namespace {

// glibc returns every freed block of 128 KiB or more to the kernel (munmap, or trimming the
// heap), so a training step that allocates and frees its activations and gradients page-faults
// them all in again every step - measured on a 2-vCPU VM: a small ResNet's step at np 2 took
// 62-74 ms with glibc's defaults and 36-37 ms with these settings (the mmap threshold alone:
// 43-46 ms; a trim threshold alone turns off glibc's adaptive mmap threshold: 116 ms). Both are
// process-wide, set once; a user's own MALLOC_* or GLIBC_TUNABLES choice wins.
void TuneAllocator() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"}) {
      if (std::getenv(v) != nullptr) return;
    }
    const bool ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1 &&  // glibc's maximum
                    mallopt(M_TRIM_THRESHOLD, 256 << 20) == 1;
    if (!ok) HVDL_LOG(Debug) << "mallopt refused the allocator settings; left as they were";
  });
#endif
}

// CPUs this process may run on (its affinity mask), at least 1.
int UsableCpus() {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

Context::Context(const Config& config, CommRuntime comm, const InitOptions& options)
    : config_(config), comm_(std::move(comm)), handles_(options.handles) {}

Status Context::Create(const Config& config, CommRuntime comm, const InitOptions& options,
                       std::unique_ptr<Context>* out) {
  std::unique_ptr<Context> ctx(new Context(config, std::move(comm), options));
  HVDL_RETURN_IF_ERROR(ctx->Init(options));
  *out = std::move(ctx);
  return Status::Ok();
}

Status Context::Init(const InitOptions& options) {
  if (config_.malloc_tuning) TuneAllocator();
  dynamic_sets_ = options.dynamic_process_sets < 0 ? config_.dynamic_process_sets
                                                   : options.dynamic_process_sets != 0;
  const Topology& t = comm_.topology;
  ConfigureLogging(t.rank, t.size, config_.log_level, config_.log_hide_time);
  WatchLauncher(t.rank);
  sets_ = std::make_unique<ProcessSetTable>(t.size);
  for (const std::vector<int>& ranks : options.process_sets) {
    int id = sets_->NextId();
    HVDL_RETURN_IF_ERROR(comm_.backends->AddProcessSet(id, ranks));
    sets_->Add(id, ranks);
  }
  timeline_ = std::make_unique<Timeline>();
  observer_ = std::make_unique<Observer>(this);
  queue_ = std::make_unique<TensorQueue>(handles_);
  fusion_ = std::make_unique<FusionBuffer>();
  const double stall = config_.stall_check_disable ? 0.0 : config_.stall_check_seconds;
  controller_ = std::make_unique<Controller>(comm_.control.get(), sets_.get(),
                                             static_cast<size_t>(config_.cache_capacity), stall,
                                             config_.stall_shutdown_seconds);
  controller_->set_timeline(timeline_.get());
  ExecutorDeps deps;
  deps.queue = queue_.get();
  deps.sets = sets_.get();
  deps.backends = comm_.backends.get();
  deps.fusion = fusion_.get();
  deps.planner = comm_.planner.get();
  deps.rank = t.rank;
  deps.device_ops = comm_.device_ops.get();
  executor_ = std::make_unique<Executor>(deps);
  executor_->set_fusion_threshold(config_.fusion_threshold_bytes);
  executor_->set_observer(observer_.get());
  executor_->set_stream_completion(config_.gpu_stream_completion && !config_.autotune);
  LoopDeps loop_deps;
  loop_deps.queue = queue_.get();
  loop_deps.controller = controller_.get();
  loop_deps.executor = executor_.get();
  loop_deps.config = &config_;
  loop_deps.timeline = timeline_.get();
  loop_deps.handles = handles_;
  loop_deps.peer_failed = comm_.peer_failed;
  loop_deps.recover = comm_.recover;
  loop_deps.hold_until_wait = config_.hold_until_wait == Toggle::kOn ||
                              (config_.hold_until_wait == Toggle::kAuto &&
                               t.local_size >= UsableCpus());
  // Before the background thread starts: it inherits the pinning.
  const int cpu = BindCallingThread(config_.bind_ranks, t.local_rank, t.local_size);
  if (cpu >= 0) HVDL_LOG(Debug) << "pinned to CPU " << cpu << " (HOROVOD_BIND_RANKS)";
  loop_ = std::make_unique<BackgroundLoop>(loop_deps);
  loop_->set_cycle_hook([this](const CycleResult& r) { OnCycle(r); });
  stats_.params = TunedParams{true, config_.fusion_threshold_bytes, config_.cycle_time_ms,
                              config_.allreduce_algorithm, false};
  if (config_.autotune && t.rank == 0) {
    TuneParams start{config_.fusion_threshold_bytes, config_.cycle_time_ms,
                     config_.allreduce_algorithm};
    tuner_ = std::make_unique<Autotuner>(
        start, config_.allreduce_algorithm == AllreduceAlgorithm::kAuto,
        static_cast<int>(config_.autotune_warmup_samples),
        static_cast<int>(config_.autotune_steps_per_sample), config_.autotune_log);
  }
  if (!config_.timeline_path.empty()) {
    HVDL_RETURN_IF_ERROR(StartTimeline(config_.timeline_path, config_.timeline_mark_cycles));
  }
  HVDL_LOG(Debug) << "initialized: " << t.size << " ranks, local " << t.local_rank << "/"
                  << t.local_size << ", fusion threshold " << config_.fusion_threshold_bytes
                  << " B, cycle time " << config_.cycle_time_ms << " ms, cache capacity "
                  << config_.cache_capacity;
  // A user thread starting to block on a handle interrupts the loop's batching and slow polls.
  if (handles_ != nullptr) {
    handles_->SetBlockHook([queue = queue_.get()] { queue->Wake(); });
    const bool spare_core = t.local_size < UsableCpus();
    const int64_t spin = config_.wait_spin_us >= 0 ? config_.wait_spin_us : spare_core ? 50 : 0;
    handles_->SetSpinWindow(std::chrono::microseconds(spin));
  }
  loop_->Start();
  notices_ = std::make_unique<LauncherNotices>([this](const std::string& line) {
    Abort("the job " + line + " (seen by rank " + LogIdentity() +
          "); the collectives that need those ranks cannot complete");
  });
  if (comm_.watch) {
    comm_.watch([this](const std::string& why) {
      Abort("the job " + why + " (seen by rank " + LogIdentity() +
            "); the collectives that need those ranks cannot complete");
    });
  }
  return Status::Ok();
}

Context::~Context() {
  notices_.reset();
  if (handles_ != nullptr) handles_->SetBlockHook(nullptr);
  if (loop_) {
    loop_->RequestShutdown("horovodlite runtime destroyed");
    loop_->Join();
  }
  // After the loop: a failing collective may still have asked the watcher to explain it.
  if (comm_.stop_watching) comm_.stop_watching();
  if (timeline_) timeline_->Stop();
}

Status Context::StartTimeline(const std::string& path, bool mark_cycles) {
  if (comm_.topology.rank != 0) return Status::Ok();
  return timeline_->Start(path, mark_cycles);
}

void Context::StopTimeline() { timeline_->Stop(); }

SummaryStats Context::TakeSummary() {
  std::lock_guard<std::mutex> lock(stats_mu_);
  SummaryStats out = summary_;
  out.wait_seconds = stats_.controller.wait_seconds - summary_wait_base_;
  out.fusion_threshold = executor_->fusion_threshold();
  summary_wait_base_ = stats_.controller.wait_seconds;
  summary_ = SummaryStats();
  return out;
}

void Context::Shutdown(const std::string& reason) {
  loop_->RequestShutdown(reason);
  // The shutdown cycle needs every rank: keep listening for the launcher while waiting, since a
  // host lost now (or a cut link noticed now) would leave us waiting for ever otherwise. Once
  // aborted, the loop may be blocked inside MPI with the lost ranks: give it 2 s, no more.
  bool joined = true;
  while (!loop_->JoinFor(std::chrono::milliseconds(200))) {
    if (aborted_) {
      if (!loop_->JoinFor(std::chrono::seconds(2))) {
        HVDL_LOG(Error) << "the background thread is still blocked in a collective with the "
                           "lost ranks; leaving it behind";
        joined = false;
      }
      break;
    }
  }
  if (!aborted_) return;
  // An aborted context is never destroyed (see Abort), so what ~Context ends ends here: its
  // launcher-notice subscription (a notice arriving during the next round's rendezvous then
  // waits for the next context instead of reaching this retired one only) and, once its loop
  // has joined (a loop left behind may still wait on it), the watchdog, which would otherwise
  // go on polling the store and name the old round's ranks as lost.
  timeline_->Stop();
  notices_.reset();
  if (joined && comm_.stop_watching) comm_.stop_watching();
}

// Runs on the notices thread. Only refuses new work and fails the handles; the loop, when it
// sees the abort, fails what is queued on its own thread (TensorEntry::done's contract). An
// aborted context must never be destroyed: requests of it (a posted negotiation reduce, a ring
// step) may still be in MPI's hands, pointing into its memory.
void Context::Abort(const std::string& why) {
  if (aborted_.exchange(true)) return;
  HVDL_LOG(Error) << why;
  Status status = Status::Aborted(why);
  queue_->Refuse(status);
  loop_->Abort(status);
  if (comm_.cancel) comm_.cancel(why);
  if (handles_ != nullptr) handles_->FailPending(status);
}

// Every rank applies new parameters at the same cycle, before running its responses, so the
// fusion plan of that cycle is the same everywhere.
void Context::Apply(const TunedParams& p) {
  executor_->set_fusion_threshold(p.fusion_threshold_bytes);
  loop_->set_cycle_time_ms(p.cycle_time_ms);
  comm_.planner->set_algorithm(p.algorithm);
  HVDL_LOG(Debug) << "parameters now: fusion threshold " << p.fusion_threshold_bytes
                  << " B, cycle time " << p.cycle_time_ms << " ms, algorithm "
                  << AllreduceAlgorithmName(p.algorithm);
}

// Rank 0 feeds the autotuner with the allreduce bytes each cycle moves.
void Context::Autotune(const CycleResult& result) {
  if (!tuner_ || tuner_->converged()) return;
  int64_t bytes = 0;
  for (const Response& r : result.responses) {
    if (r.op == OpType::kAllreduce && !r.is_error()) {
      bytes += NumElements(r.shape) * static_cast<int64_t>(DataTypeSize(r.dtype));
    }
  }
  if (tuner_->Record(bytes, std::chrono::steady_clock::now())) {
    const TuneParams& p = tuner_->params();
    controller_->PublishParams(TunedParams{true, p.fusion_threshold_bytes, p.cycle_time_ms,
                                           p.algorithm, tuner_->converged()});
  }
}

void Context::OnCycle(const CycleResult& result) {
  for (const Response& r : result.responses) {
    if (r.op == OpType::kProcessSetRemove && !r.is_error() && !r.sizes.empty()) {
      controller_->ForgetProcessSet(static_cast<int>(r.sizes[0]));
    }
  }
  if (result.params.present) Apply(result.params);
  Autotune(result);
  std::lock_guard<std::mutex> lock(stats_mu_);
  if (result.params.present) {
    stats_.params = result.params;
    stats_.autotune_converged = result.params.converged;
  }
  stats_.controller = controller_->stats();
  stats_.cache_entries = controller_->cache().size();
  stats_.fusion_buffer_bytes = fusion_->capacity();
  stats_.single_copy_transports = 0;
  stats_.single_copy_peers = 0;
  stats_.hierarchical_allreduces = 0;
  stats_.hierarchical_allgathers = 0;
  stats_.hierarchical_reducescatters = 0;
  for (DataBackend* b : comm_.backends->all()) {
    stats_.single_copy_transports += b->single_copy_transports();
    stats_.single_copy_peers += b->single_copy_peers();
    stats_.hierarchical_allreduces += b->hierarchical_allreduces();
    stats_.hierarchical_allgathers += b->hierarchical_allgathers();
    stats_.hierarchical_reducescatters += b->hierarchical_reducescatters();
  }
}

Status Context::Submit(std::vector<TensorEntry> entries, std::vector<Request> requests,
                       std::shared_ptr<void> payload, int* handle) {
  std::string what;  // for the error when the job loses ranks meanwhile (Abort)
  if (!entries.empty()) {  // one allocation at most: this runs for every gradient
    const char* op = OpTypeName(entries[0].op);
    what.reserve(std::strlen(op) + entries[0].name.size() + 24);
    AppendTensorLabel(op, entries[0].name, &what);
    if (entries.size() > 1) {
      what.append(" and ").append(std::to_string(entries.size() - 1)).append(" more");
    }
  }
  const int h = handles_->Allocate(static_cast<int>(entries.size()), std::move(payload),
                                   std::move(what));
  for (TensorEntry& e : entries) e.handle = h;  // TensorQueue::Complete marks it done
  Status s = queue_->Add(std::move(entries), std::move(requests));
  if (!s.ok()) {
    handles_->Release(h);
    return s;
  }
  *handle = h;
  return Status::Ok();
}

std::string Context::stop_reason() const { return loop_ ? loop_->stop_reason() : ""; }

RuntimeStats Context::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace hvdl
