// The horovodlite._C module: a flat, type-erased set of functions (docs/architecture.md). Blocking
// calls release the GIL; C++ error kinds map to Python exception classes (python/runtime.h). The
// per-operation tensor bindings live in csrc/torch (the only code that includes torch).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "core/launcher_notices.h"
#include "python/runtime.h"
#include "runtime/build_info.h"
#include "runtime/job_control.h"
#include "runtime/launch.h"
#include "torch/bindings.h"

namespace py = pybind11;

namespace hvdl {
namespace {

// Starts a Context on `launch` unless one runs (a second init is a no-op).
void Start(const LaunchOptions& launch, std::vector<std::vector<int>> process_sets, int dynamic) {
  Runtime& rt = Runtime::Get();
  py::gil_scoped_release nogil;  // before the lock: never hold the GIL while waiting for it
  std::lock_guard<std::mutex> lock(rt.lifecycle_mutex());
  if (rt.context() != nullptr) return;
  if (rt.ranks_lost()) {
    py::gil_scoped_acquire gil;
    throw InternalError("horovodlite cannot start again in this process: the job lost ranks, "
                        "and its transport still counts them");
  }
  InitOptions options;
  options.process_sets = std::move(process_sets);
  options.dynamic_process_sets = dynamic;
  options.handles = &rt.handles();
  std::unique_ptr<Context> ctx;
  Status s = StartContext(launch, options, &ctx);
  if (!s.ok()) {
    py::gil_scoped_acquire gil;
    ThrowIfError(s);
  }
  rt.set_context(std::move(ctx));
}

// An mpirun launch (or MPI already initialised by mpi4py).
void Init(std::optional<int> comm_f2c, std::vector<int> ranks,
          std::vector<std::vector<int>> process_sets, int dynamic) {
  LaunchOptions launch;
  launch.has_comm = comm_f2c.has_value();
  launch.comm_f2c = comm_f2c.value_or(0);
  launch.ranks = std::move(ranks);
  Start(launch, std::move(process_sets), dynamic);
}

// A launch without MPI: what horovodlite/common/rendezvous.py found out.
void InitGloo(const py::dict& found, std::vector<std::vector<int>> process_sets, int dynamic) {
  LaunchOptions launch;
  launch.controller = LaunchOptions::Controller::kGloo;
  GlooLaunch& g = launch.gloo;
  g.rank = found["rank"].cast<int>();
  g.size = found["size"].cast<int>();
  g.local_rank = found["local_rank"].cast<int>();
  g.local_size = found["local_size"].cast<int>();
  g.cross_rank = found["cross_rank"].cast<int>();
  g.cross_size = found["cross_size"].cast<int>();
  g.hosts = found["hosts"].cast<std::vector<std::string>>();
  g.process_group = found["process_group"].cast<std::string>();
  g.shm_prefix = found["shm_prefix"].cast<std::string>();
  g.timeout_seconds = found["timeout_seconds"].cast<double>();
  if (found.contains("beats_group")) g.beats_group = found["beats_group"].cast<std::string>();
  if (found.contains("beat_seconds")) g.beat_seconds = found["beat_seconds"].cast<double>();
  if (found.contains("connections")) g.connections = found["connections"].cast<int>();
  // an elastic job's round: the launcher's notices about earlier rounds are stale from now on
  if (found.contains("round")) LauncherNotices::SetRound(found["round"].cast<int>());
  Start(launch, std::move(process_sets), dynamic);
}

void Shutdown(const std::string& reason) {
  Runtime& rt = Runtime::Get();
  py::gil_scoped_release nogil;
  std::lock_guard<std::mutex> lock(rt.lifecycle_mutex());
  std::unique_ptr<Context> ctx = rt.take_context();
  if (!ctx) return;
  ctx->Shutdown(reason);
  if (ctx->aborted()) {
    rt.retire_aborted(std::move(ctx));
    return;
  }
  if (ctx->recovered()) {
    rt.retire_recovered(std::move(ctx));
    return;
  }
  ctx.reset();
}

const Topology& Topo() { return Runtime::Get().RequireContext().topology(); }

bool Poll(int handle) {
  bool done = false;
  ThrowIfError(Runtime::Get().handles().Poll(handle, &done));
  return done;
}

py::dict Stats() {
  RuntimeStats s = Runtime::Get().RequireContext().stats();
  py::dict d;
  d["cycles"] = s.controller.cycles;
  d["negotiations"] = s.controller.negotiations;
  d["cache_hits"] = s.controller.cache_hits;
  d["invalidations"] = s.controller.invalidations;
  d["responses"] = s.controller.responses;
  d["cache_entries"] = s.cache_entries;
  d["fusion_buffer_bytes"] = s.fusion_buffer_bytes;
  d["single_copy_transports"] = s.single_copy_transports;
  d["single_copy_peers"] = s.single_copy_peers;
  d["hierarchical_allreduces"] = s.hierarchical_allreduces;
  d["hierarchical_allgathers"] = s.hierarchical_allgathers;
  d["hierarchical_reducescatters"] = s.hierarchical_reducescatters;
  d["fusion_threshold_bytes"] = s.params.fusion_threshold_bytes;
  d["cycle_time_ms"] = s.params.cycle_time_ms;
  d["allreduce_algorithm"] = AllreduceAlgorithmName(s.params.algorithm);
  d["autotune_converged"] = s.autotune_converged;
  return d;
}

py::dict Summary() {
  SummaryStats s = Runtime::Get().RequireContext().TakeSummary();
  py::dict d;
  d["collectives"] = s.collectives;
  d["tensors"] = s.tensors;
  d["bytes"] = s.bytes;
  d["bus_bytes"] = s.bus_bytes;
  d["collective_seconds"] = s.collective_seconds;
  d["wait_seconds"] = s.wait_seconds;
  d["fused_batches"] = s.fused_batches;
  d["fused_bytes"] = s.fused_bytes;
  d["fusion_threshold"] = s.fusion_threshold;
  return d;
}

py::list KnobTable() {
  py::list out;
  for (const KnobInfo& k : Knobs()) out.append(py::make_tuple(k.name, k.default_value, k.doc));
  return out;
}

py::dict ConfigDict() {
  const hvdl::Config& c = Runtime::Get().RequireContext().config();
  py::dict d;
  d["fusion_threshold_bytes"] = c.fusion_threshold_bytes;
  d["cycle_time_ms"] = c.cycle_time_ms;
  d["cache_capacity"] = c.cache_capacity;
  d["log_level"] = LogLevelName(c.log_level);
  d["stall_check_seconds"] = c.stall_check_disable ? 0.0 : c.stall_check_seconds;
  d["stall_shutdown_seconds"] = c.stall_shutdown_seconds;
  d["timeline"] = c.timeline_path;
  d["autotune"] = c.autotune;
  d["allreduce_algorithm"] = AllreduceAlgorithmName(c.allreduce_algorithm);
  d["summary_steps"] = c.summary_steps;
  d["native_gradient_hooks"] = c.native_gradient_hooks;
  d["wait_spin_us"] = c.wait_spin_us;
  return d;
}

}  // namespace
}  // namespace hvdl

PYBIND11_MODULE(_C, m) {
  using namespace hvdl;
  m.doc() = "horovodlite C++ core";
  py::register_exception<InternalError>(m, "HorovodInternalError", PyExc_RuntimeError);
  // Horovod raises ValueError for some argument errors (Python checks) and RuntimeError for
  // others (its C++ layer); user code catches either, so ours is both.
  py::register_exception<ArgumentError>(
      m, "HorovodArgumentError",
      py::make_tuple(py::handle(PyExc_ValueError), py::handle(PyExc_RuntimeError)));

  m.def("init", &Init, py::arg("comm_f2c") = py::none(), py::arg("ranks") = std::vector<int>(),
        py::arg("process_sets") = std::vector<std::vector<int>>(), py::arg("dynamic") = -1);
  m.def("init_gloo", &InitGloo, py::arg("launch"),
        py::arg("process_sets") = std::vector<std::vector<int>>(), py::arg("dynamic") = -1);
  m.def("shutdown", &Shutdown, py::arg("reason") = "hvd.shutdown() was called");
  m.def("is_initialized", [] { return Runtime::Get().context() != nullptr; });
  m.def("finalize_transport", [] { FinalizeCommTransport(); },
        py::call_guard<py::gil_scoped_release>());
  m.def("ranks_lost", [] { return Runtime::Get().ranks_lost(); });
  m.def("fault_tolerance_built", [] { return FaultToleranceBuilt(); });
  m.def("last_recovery_map", [] { return LastRecoveryMap(); });
  m.def("recoveries", [] { return Recoveries(); });
  m.def("lost_hosts", [] { return LostHosts(); });
  m.def("request_growth", &RequestGrowth, py::arg("count"), py::arg("command"),
        py::arg("argv"), py::arg("host") = "", py::arg("env") = std::vector<std::string>());
  m.def("grown", [] { return Grown(); });
  m.def("retire", [](bool leaving) {
    if (Runtime::Get().context() != nullptr) {
      ThrowIfError(Status::Internal("retire: shut horovodlite down first"));
    }
    std::vector<int> map;
    {
      py::gil_scoped_release nogil;  // collective: the other ranks may take a while
      ThrowIfError(Retire(leaving, &map));
    }
    return map;
  }, py::arg("leaving"));
  m.def("retired", [] { return Retired(); });
  m.def("spawned", [] { return Spawned(); });
  m.def("rank", [] { return Topo().rank; });
  m.def("size", [] { return Topo().size; });
  m.def("local_rank", [] { return Topo().local_rank; });
  m.def("local_size", [] { return Topo().local_size; });
  m.def("cross_rank", [] { return Topo().cross_rank; });
  m.def("cross_size", [] { return Topo().cross_size; });
  m.def("is_homogeneous", [] { return Topo().homogeneous; });
  m.def("mpi_threads_supported", [] { return Topo().thread_multiple; });
  m.def("mpi_built", [] { return MpiBuilt(); });
  m.def("gloo_built", [] { return GlooBuilt(); });
  m.def("cuda_built", [] { return CudaBuilt(); });
  m.def("nccl_version", [] { return NcclVersion(); });
  m.def("transport_version", [] { return TransportVersion(); });
  m.def("mpi_library_version", [] { return MpiLibraryVersion(); });
  m.def("poll", &Poll, py::arg("handle"));
  m.def("release", [](int h) { Runtime::Get().handles().Release(h); }, py::arg("handle"));
  m.def("stats", &Stats);
  m.def("take_summary", &Summary);
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    ThrowIfError(Runtime::Get().RequireContext().StartTimeline(path, mark_cycles));
  }, py::arg("path"), py::arg("mark_cycles") = false);
  m.def("stop_timeline", [] {
    Context& ctx = Runtime::Get().RequireContext();
    py::gil_scoped_release nogil;
    ctx.StopTimeline();
  });
  m.def("config", &ConfigDict);
  m.def("knobs", &KnobTable);
  m.def("stop_reason", [] { return Runtime::Get().RequireContext().stop_reason(); });
  RegisterTorchOps(m, TorchOpsHost{[]() -> Context& { return Runtime::Get().RequireContext(); },
                                    &Runtime::Get().handles()});
}
