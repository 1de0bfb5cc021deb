// horovodlite._testing, device part: the executor's device path without a GPU.
//
// HostDeviceOps stands in for CUDA (its ScaleCopy walks the kernel's tiles, comm/batch_copy.h),
// ThreadBackend for NCCL or MPI with N ranks as threads. run_device_ops drives the real Executor
// (and so the device path of core/batch_ops, and HostStagingBackend when staging=True) through
// agreed responses built by the real BuildResponse, on every rank, and returns what each rank
// got. mode="transports" runs host tensors on the host collectives over LocalTransports instead.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <thread>

#include "comm/allreduce_planner.h"
#include "comm/backend_registry.h"
#include "comm/batch_copy.h"
#include "comm/host_device_ops.h"
#include "comm/host_collectives.h"
#include "comm/host_staging.h"
#include "common/errors.h"
#include "core/device_inflight.h"
#include "core/executor.h"
#include "core/response_builder.h"
#include "runtime/build_info.h"
#include "testing/local_transport_fabric.h"
#include "testing/thread_backend.h"

namespace py = pybind11;

namespace hvdl {
namespace {

// One op as the test describes it; per-rank lists are indexed by rank.
struct OpSpec {
  OpType op = OpType::kAllreduce;
  std::string name;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0, postscale = 1.0;
  int root = 0;
  bool in_place = false;
  std::vector<Shape> shapes;
  std::vector<std::string> inputs;
  std::vector<std::vector<int64_t>> splits;
  // Per rank (allreduce in place, host): element counts of the runs its tensor lives in
  // (TensorEntry::pieces), laid out apart and in reverse order; empty: one tensor.
  std::vector<std::vector<int64_t>> pieces;
  int device = 0;  // kCpuDevice for the host path (mode "transports")
};

// What one rank got for one op.
struct OpResult {
  std::string input, output;  // storage the entry points into
  bool has_output = false;    // false: in place, the result is in `input`
  std::string error;
  std::vector<int64_t> extra;
  std::string scattered;  // the runs of a tensor in pieces; gathered into `input` when done
  std::vector<Span> runs;
  size_t esize = 0;
  bool done = false, device_done = false;
  std::shared_ptr<HostEvent> ready;
};

OpSpec ToSpec(const py::dict& d) {
  OpSpec s;
  s.op = static_cast<OpType>(d["op"].cast<int>());
  s.name = d["name"].cast<std::string>();
  s.dtype = static_cast<DataType>(d["dtype"].cast<int>());
  if (d.contains("reduce_op")) s.reduce_op = static_cast<ReduceOp>(d["reduce_op"].cast<int>());
  if (d.contains("prescale")) s.prescale = d["prescale"].cast<double>();
  if (d.contains("postscale")) s.postscale = d["postscale"].cast<double>();
  if (d.contains("root")) s.root = d["root"].cast<int>();
  if (d.contains("in_place")) s.in_place = d["in_place"].cast<bool>();
  s.shapes = d["shapes"].cast<std::vector<Shape>>();
  for (const auto& b : d["inputs"].cast<py::list>()) s.inputs.push_back(b.cast<std::string>());
  if (d.contains("splits")) s.splits = d["splits"].cast<std::vector<std::vector<int64_t>>>();
  if (d.contains("pieces")) s.pieces = d["pieces"].cast<std::vector<std::vector<int64_t>>>();
  return s;
}

Request ToRequest(const OpSpec& s, int rank) {
  Request q;
  q.op = s.op;
  q.name = s.name;
  q.rank = rank;
  q.dtype = s.dtype;
  q.shape = s.shapes[static_cast<size_t>(rank)];
  q.reduce_op = s.reduce_op;
  q.prescale = s.prescale;
  q.postscale = s.postscale;
  q.root = s.root;
  q.device = s.device;
  if (!s.splits.empty()) q.splits = s.splits[static_cast<size_t>(rank)];
  return q;
}

TensorEntry ToEntry(const OpSpec& s, int rank, OpResult* res) {
  TensorEntry e;
  e.name = s.name;
  e.op = s.op;
  res->input = s.inputs[static_cast<size_t>(rank)];
  e.input = TensorRef{res->input.data(), s.dtype, s.shapes[static_cast<size_t>(rank)], s.device};
  if (s.op == OpType::kAllreduce || s.op == OpType::kBroadcast) {
    if (!s.in_place) res->output.assign(res->input.size(), '\0');
    res->has_output = !s.in_place;
    e.output = e.input;
    e.output.data = s.in_place ? res->input.data() : res->output.data();
  }
  e.allocate = [res, dtype = s.dtype, device = s.device](const Shape& shape, TensorRef* out) {
    res->output.assign(static_cast<size_t>(NumElements(shape)) * DataTypeSize(dtype), '\0');
    res->has_output = true;
    *out = TensorRef{res->output.data(), dtype, shape, device};
    return Status::Ok();
  };
  if (s.device != kCpuDevice) {
    res->ready = std::make_shared<HostEvent>(0);
    e.ready = res->ready;
    e.device_done = [res](const std::shared_ptr<DeviceEvent>& ev) {
      res->device_done = ev != nullptr;
    };
  }
  if (static_cast<size_t>(rank) < s.pieces.size() && !s.pieces[static_cast<size_t>(rank)].empty()) {
    // The runs apart (a gap of one element's worth of 0xAB after each) and in reverse order,
    // so that no run starts where the one before it ends.
    const std::vector<int64_t>& counts = s.pieces[static_cast<size_t>(rank)];
    const size_t esize = DataTypeSize(s.dtype);
    res->esize = esize;
    size_t bytes = 0;
    for (int64_t c : counts) bytes += static_cast<size_t>(c) * esize + esize;
    res->scattered.assign(bytes, '\xab');
    size_t at = bytes, from = 0;
    for (int64_t c : counts) {
      const size_t len = static_cast<size_t>(c) * esize;
      at -= len + esize;
      std::copy_n(res->input.data() + from, len, res->scattered.data() + at);
      res->runs.push_back(Span{res->scattered.data() + at, c});
      from += len;
    }
    e.pieces = res->runs;
    e.input.data = res->runs.front().data;
    e.output = e.input;
    res->has_output = false;
  }
  e.done = [res](const Status& st, const std::vector<int64_t>& extra) {
    size_t at = 0;
    for (const Span& run : res->runs) {  // a tensor in pieces: its result, in order
      const size_t len = static_cast<size_t>(run.count) * res->esize;
      std::copy_n(static_cast<const char*>(run.data), len, res->input.data() + at);
      at += len;
    }
    res->done = true;
    res->error = st.message();
    res->extra = extra;
  };
  return e;
}

// How the ranks of run_device_ops move data:
//   device      device tensors (HostDeviceOps) on the thread backend's device collectives;
//   staging     device tensors through host staging over the thread backend's host collectives;
//   transports  host tensors on the host collectives over a LocalTransportFabric (LocalTransports, with
//               the single-copy layer when hosts are given): horovodlite's own algorithms, no
//               native collective at all - what a launch with nothing but a Transport runs.
struct RunMode {
  std::string name = "device";
  std::vector<std::string> hosts;  // transports: rank -> pretend host; empty: no single copy
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  size_t staging_chunk_bytes = 0;  // staging: the pipeline's chunk (0: one piece)
  bool stream_completion = false;  // device and staging: HOROVOD_GPU_COMPLETION=stream
};

struct Shared {
  std::shared_ptr<ThreadFabric> threads;
  std::shared_ptr<LocalMailboxes> boxes;
};

// One rank: submit its entries, run the agreed responses, report the counters.
HostDeviceOpsCounters RunRank(int rank, bool joined, const RunMode& mode, int64_t threshold,
                              const Shared& shared, const std::vector<OpSpec>& specs,
                              const std::vector<Response>& responses,
                              std::vector<OpResult>* results, int* single_copy_peers) {
  const int n = shared.threads->size();
  HostDeviceOps ops;
  BackendRegistry registry;
  std::unique_ptr<LocalTransportFabric> fabric;
  Config config;
  config.allreduce_algorithm = mode.algorithm;
  if (mode.name == "staging") {
    auto host = std::make_unique<ThreadBackend>(shared.threads, rank, false);
    DataBackend* host_ptr = host.get();
    registry.Add(std::move(host));
    registry.Add(std::make_unique<HostStagingBackend>(
        host_ptr, &ops, [rank](int ps) { return ps == 0 ? rank : -1; },
        mode.staging_chunk_bytes));
  } else if (mode.name == "transports") {
    fabric = std::make_unique<LocalTransportFabric>(shared.boxes, rank, mode.hosts, !mode.hosts.empty());
    registry.Add(std::make_unique<HostCollectives>(fabric.get(), nullptr));
  } else {
    registry.Add(std::make_unique<ThreadBackend>(shared.threads, rank, true));
  }
  AllreducePlanner planner(config, fabric.get(), &registry);
  if (fabric) static_cast<HostCollectives*>(registry.all()[0])->set_planner(&planner);
  ProcessSetTable sets(n);
  TensorQueue queue;
  FusionBuffer fusion;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (joined) continue;
    queue.Add({ToEntry(specs[i], rank, &(*results)[i])}, {ToRequest(specs[i], rank)});
  }
  std::vector<Request> popped;
  queue.PopRequests(&popped);
  ExecutorDeps deps;
  deps.queue = &queue;
  deps.sets = &sets;
  deps.backends = &registry;
  deps.fusion = &fusion;
  deps.planner = &planner;
  deps.rank = rank;
  deps.device_ops = &ops;
  Executor executor(deps);
  executor.set_fusion_threshold(threshold);
  executor.set_stream_completion(mode.stream_completion);
  executor.Run(responses, joined);
  executor.PollDevice();
  *single_copy_peers = fabric ? fabric->single_copy_peers() : 0;
  return ops.counters();
}

py::list RunDeviceOps(int nranks, const std::vector<py::dict>& ops, bool staging,
                      int64_t threshold, const std::vector<int>& joined, const std::string& mode,
                      const std::vector<std::string>& hosts, const std::string& algorithm,
                      int64_t staging_chunk_bytes, bool stream_completion) {
  RunMode run;
  run.stream_completion = stream_completion;
  run.staging_chunk_bytes = static_cast<size_t>(std::max<int64_t>(0, staging_chunk_bytes));
  run.name = staging ? "staging" : mode;
  run.hosts = hosts;
  if (algorithm == "ring") run.algorithm = AllreduceAlgorithm::kRing;
  if (algorithm == "mpi") run.algorithm = AllreduceAlgorithm::kMpi;
  if (run.name != "device" && run.name != "staging" && run.name != "transports") {
    ThrowIfError(Status::InvalidArgument("mode: device, staging or transports"));
  }
  std::vector<OpSpec> specs;
  for (const py::dict& d : ops) {
    specs.push_back(ToSpec(d));
    if (run.name == "transports") specs.back().device = kCpuDevice;
  }
  std::vector<int> members;
  for (int r = 0; r < nranks; ++r) members.push_back(r);
  auto is_joined = [&](int r) {
    for (int j : joined) if (j == r) return true;
    return false;
  };
  std::vector<Request> all_requests;
  std::vector<Response> responses;
  for (const OpSpec& s : specs) {
    std::vector<Request> reqs;
    for (int r = 0; r < nranks; ++r) reqs.push_back(ToRequest(s, r));
    std::vector<const Request*> ptrs;
    for (int r = 0; r < nranks; ++r) ptrs.push_back(is_joined(r) ? nullptr : &reqs[static_cast<size_t>(r)]);
    responses.push_back(BuildResponse(ptrs, members));
  }
  Shared shared{std::make_shared<ThreadFabric>(nranks), std::make_shared<LocalMailboxes>(nranks)};
  std::vector<int> peers(static_cast<size_t>(nranks), 0);
  std::vector<std::vector<OpResult>> results(static_cast<size_t>(nranks),
                                             std::vector<OpResult>(specs.size()));
  std::vector<HostDeviceOpsCounters> counters(static_cast<size_t>(nranks));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; ++r) {
      threads.emplace_back([&, r] {
        counters[static_cast<size_t>(r)] =
            RunRank(r, is_joined(r), run, threshold, shared, specs, responses,
                    &results[static_cast<size_t>(r)], &peers[static_cast<size_t>(r)]);
      });
    }
    for (auto& t : threads) t.join();
  }
  py::list out;
  for (int r = 0; r < nranks; ++r) {
    py::list per_op;
    for (const OpResult& res : results[static_cast<size_t>(r)]) {
      py::dict d;
      d["output"] = py::bytes(res.has_output ? res.output : res.input);
      d["error"] = res.error;
      d["extra"] = res.extra;
      d["done"] = res.done;
      d["device_done"] = res.device_done;
      d["ready_waits"] = res.ready ? res.ready->stream_waits() : 0;
      per_op.append(d);
    }
    const HostDeviceOpsCounters& c = counters[static_cast<size_t>(r)];
    py::dict stats;
    stats["launches"] = c.launches;
    stats["regions"] = c.regions;
    stats["records"] = c.records;
    stats["host_copies"] = c.host_copies;
    stats["single_copy_peers"] = peers[static_cast<size_t>(r)];
    out.append(py::make_tuple(per_op, stats));
  }
  return out;
}

// HostDeviceOps::ScaleCopy over separate regions (in place when dst is src).
py::tuple DeviceScaleCopy(const std::vector<std::string>& blobs, int dtype, double factor,
                          bool in_place) {
  std::vector<std::string> src = blobs, dst;
  for (const std::string& b : blobs) dst.emplace_back(b.size(), '\0');
  const auto dt = static_cast<DataType>(dtype);
  std::vector<CopyRegion> regions;
  for (size_t i = 0; i < blobs.size(); ++i) {
    void* out = in_place ? src[i].data() : dst[i].data();
    regions.push_back({out, src[i].data(), static_cast<int64_t>(blobs[i].size() / DataTypeSize(dt))});
  }
  HostDeviceOps ops;
  ThrowIfError(ops.SetDevice(0));
  ThrowIfError(ops.ScaleCopy(regions, dt, factor));
  std::vector<py::bytes> result;
  for (size_t i = 0; i < blobs.size(); ++i) result.emplace_back(in_place ? src[i] : dst[i]);
  return py::make_tuple(result, ops.counters().launches);
}

// (tile, region, first, last) for every tile of regions of these sizes, as the kernel's blocks
// would see them.
std::vector<std::tuple<int64_t, int, int64_t, int64_t>> BatchPlan(const std::vector<int64_t>& counts) {
  const std::vector<int64_t> starts = batch::TileStarts(counts);
  std::vector<std::tuple<int64_t, int, int64_t, int64_t>> out;
  for (int64_t t = 0; t < starts.back(); ++t) {
    const int r = batch::FindRegion(starts.data(), static_cast<int>(counts.size()), t);
    int64_t first = 0, last = 0;
    batch::TileRange(starts.data(), r, t, counts[static_cast<size_t>(r)], &first, &last);
    out.emplace_back(t, r, first, last);
  }
  return out;
}

// The build's real DeviceOps (CUDA) on raw device pointers: (dst, src, count) regions, one
// ScaleCopy, then a wait for its stream. The caller synchronises torch's stream first.
int64_t DeviceOpsScaleCopy(int device, const std::vector<std::tuple<uintptr_t, uintptr_t, int64_t>>& regions,
                           int dtype, double factor) {
  std::unique_ptr<DeviceOps> ops = MakeDeviceOps(0);
  if (!ops) ThrowIfError(Status::InvalidArgument("this horovodlite was built without CUDA"));
  std::vector<CopyRegion> rs;
  for (const auto& [dst, src, count] : regions) {
    rs.push_back({reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), count});
  }
  py::gil_scoped_release nogil;
  Status s = ops->SetDevice(device);
  if (s.ok()) s = ops->ScaleCopy(rs, static_cast<DataType>(dtype), factor);
  if (s.ok()) s = ops->Synchronize();
  py::gil_scoped_acquire gil;
  ThrowIfError(s);
  return static_cast<int64_t>(rs.size());
}

// A device event that completes after `done_after` queries (-1: never; Synchronize completes
// it), or whose queries fail when `fails`.
class ScriptedEvent : public DeviceEvent {
 public:
  ScriptedEvent(int done_after, bool fails) : left_(done_after), fails_(fails) {}
  int device() const override { return 0; }
  Status StreamWait(void*) override { return Status::Ok(); }
  Status Query(bool* done) override {
    ++queries;
    if (fails_) return Status::Internal("the device reported an illegal address");
    *done = left_ == 0;
    if (left_ > 0) --left_;
    return Status::Ok();
  }
  Status Synchronize() override {
    left_ = 0;
    ++syncs;
    return fails_ ? Status::Internal("the device reported an illegal address") : Status::Ok();
  }
  int queries = 0;
  int syncs = 0;

 private:
  int left_;
  bool fails_;
};

// A backend whose only behaviour is an asynchronous failure, once `fail` is set.
class AsyncFailingBackend : public ThreadBackend {
 public:
  AsyncFailingBackend() : ThreadBackend(std::make_shared<ThreadFabric>(1), 0, true) {}
  Status CheckAsync() override {
    ++checks;
    return fail ? Status::Internal("NCCL (asynchronous error): remote process exited") : Status::Ok();
  }
  bool fail = false;
  int checks = 0;
};

// DeviceInFlight driven by a script: ("add", done_after, fails) tracks a new batch named
// "b<i>", ("poll",), ("drain",), ("fail",) makes the backend report an asynchronous failure.
// Returns, per step, (step, status message or "", batches tracked, backend checks), and the
// queries and synchronizations of each event.
py::tuple DeviceInFlightScript(const std::vector<py::tuple>& script, int max_depth) {
  DeviceInFlight flight(static_cast<size_t>(max_depth));
  AsyncFailingBackend be;
  std::vector<std::shared_ptr<ScriptedEvent>> events;
  py::list log;
  for (const py::tuple& step : script) {
    const std::string what = step[0].cast<std::string>();
    Status s;
    if (what == "add") {
      auto ev = std::make_shared<ScriptedEvent>(step[1].cast<int>(), step[2].cast<bool>());
      events.push_back(ev);
      s = flight.Add(ev, &be, "b" + std::to_string(events.size() - 1));
    } else if (what == "poll") {
      s = flight.Poll();
    } else if (what == "drain") {
      s = flight.Drain();
    } else if (what == "fail") {
      be.fail = true;
    } else {
      ThrowIfError(Status::InvalidArgument("script steps: add, poll, drain, fail"));
    }
    log.append(py::make_tuple(what, s.message(), flight.size(), be.checks));
  }
  py::list per_event;
  for (const auto& ev : events) per_event.append(py::make_tuple(ev->queries, ev->syncs));
  return py::make_tuple(log, per_event);
}

}  // namespace

void RegisterDeviceTesting(py::module_& m) {
  m.def("run_device_ops", &RunDeviceOps, py::arg("nranks"), py::arg("ops"),
        py::arg("staging") = false, py::arg("fusion_threshold") = 64 << 20,
        py::arg("joined") = std::vector<int>(), py::arg("mode") = "device",
        py::arg("hosts") = std::vector<std::string>(), py::arg("algorithm") = "auto",
        py::arg("staging_chunk_bytes") = 0, py::arg("stream_completion") = false);
  m.def("device_inflight_script", &DeviceInFlightScript, py::arg("script"),
        py::arg("max_depth") = 64);
  m.def("device_scale_copy", &DeviceScaleCopy, py::arg("blobs"), py::arg("dtype"),
        py::arg("factor"), py::arg("in_place") = false);
  m.def("batch_plan", &BatchPlan, py::arg("counts"));
  m.attr("batch_tile_elements") = batch::kTileElements;
  m.def("device_ops_scale_copy", &DeviceOpsScaleCopy, py::arg("device"), py::arg("regions"),
        py::arg("dtype"), py::arg("factor"));
}

}  // namespace hvdl
