// horovodlite._testing, stream completion's failure path: the real Executor with
// HOROVOD_GPU_COMPLETION=stream on one rank, over a stand-in device whose work stays queued
// until it is asked about or its stream is synchronized, and whose first batch fails
// asynchronously on command. What a batch that fails with an earlier batch's error may leave
// behind: the entries complete with the error, so the user may free the tensors at once, and
// nothing of the batch may still be queued on the device then. With `hung`, the second batch's
// work never finishes by itself (a collective waiting for a peer that is gone): it must end by
// the backend's abort, never by a stream synchronize, which would not return.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce_planner.h"
#include "comm/backend_registry.h"
#include "comm/host_device_ops.h"
#include "core/executor.h"
#include "core/response_builder.h"
#include "testing/thread_backend.h"

namespace py = pybind11;

namespace hvdl {
namespace {

class QueuedDeviceOps;

// A batch's "finished" event: complete once its stream was synchronized.
class QueuedEvent : public DeviceEvent {
 public:
  QueuedEvent(QueuedDeviceOps* ops, size_t index) : ops_(ops), index_(index) {}
  int device() const override { return 0; }
  Status StreamWait(void*) override { return Status::Ok(); }
  Status Query(bool* done) override;
  Status Synchronize() override;
  bool ran = false;

 private:
  QueuedDeviceOps* ops_;
  size_t index_;
};

// HostDeviceOps (host memory, eager copies) whose events stay pending until Synchronize.
class QueuedDeviceOps : public HostDeviceOps {
 public:
  Status Record(std::shared_ptr<DeviceEvent>* out) override {
    auto ev = std::make_shared<QueuedEvent>(this, events.size());
    events.push_back(ev);
    *out = ev;
    return Status::Ok();
  }
  Status Synchronize() override {
    ++stream_syncs;
    if (hung && !aborted) synced_while_hung = true;  // a real device would never return
    for (auto& ev : events) ev->ran = true;
    return Status::Ok();
  }
  bool stuck() const { return hung && !aborted; }
  std::vector<std::shared_ptr<QueuedEvent>> events;
  int stream_syncs = 0;
  bool fail_first = false;  // the first batch's work failed (the device says so when asked)
  bool hung = false;        // work recorded from now on never finishes by itself
  bool aborted = false;     // the backend aborted its device work
  bool synced_while_hung = false;
};

Status QueuedEvent::Query(bool* done) {
  if (ops_->fail_first && index_ == 0) {
    return Status::Internal("the device reported an illegal address");
  }
  if (!ops_->stuck()) ran = true;  // asked about: the work runs (CUDA's runs on its own)
  *done = ran;
  return Status::Ok();
}

Status QueuedEvent::Synchronize() {
  if (ops_->stuck()) ops_->synced_while_hung = true;
  ran = true;
  return Status::Ok();
}

// The backend whose AbortDevice ends the stand-in device's hung work (NCCL's abort ends its
// kernels).
class AbortableBackend : public ThreadBackend {
 public:
  AbortableBackend(std::shared_ptr<ThreadFabric> fabric, QueuedDeviceOps* ops)
      : ThreadBackend(std::move(fabric), 0, true), ops_(ops) {}
  void AbortDevice() override { ops_->aborted = true; }

 private:
  QueuedDeviceOps* ops_;
};

struct Outcome {
  bool done = false;
  std::string error;
  bool device_done = false;
  bool queued_at_done = false;  // some of its batch's device work was still queued at `done`
};

// Batch "a" runs; its work then fails asynchronously; batch "b" runs next and fails with a's
// error, found by the executor's poll between the two (`poll`) or, without one, by b's own
// hand-over to the in-flight list (DeviceInFlight::Add retires a first). With `hung`, b's own
// work never finishes by itself. Returns each batch's outcome and the device's.
py::dict StreamFailureScript(bool poll, bool hung) {
  QueuedDeviceOps ops;
  BackendRegistry registry;
  registry.Add(std::make_unique<AbortableBackend>(std::make_shared<ThreadFabric>(1), &ops));
  Config config;
  AllreducePlanner planner(config, nullptr, &registry);
  ProcessSetTable sets(1);
  TensorQueue queue;
  FusionBuffer fusion;
  ExecutorDeps deps;
  deps.queue = &queue;
  deps.sets = &sets;
  deps.backends = &registry;
  deps.fusion = &fusion;
  deps.planner = &planner;
  deps.rank = 0;
  deps.device_ops = &ops;
  Executor executor(deps);
  executor.set_stream_completion(true);
  executor.set_failure_wait(0.2);

  std::vector<float> data_a(4, 1.0f), data_b(4, 2.0f);
  Outcome a, b;
  auto run = [&](const std::string& name, std::vector<float>* data, Outcome* out) {
    TensorEntry e;
    e.name = name;
    e.op = OpType::kAllreduce;
    e.input = TensorRef{data->data(), DataType::kFloat32, {4}, 0};
    e.output = e.input;
    e.ready = std::make_shared<HostEvent>(0);
    const size_t first_event = ops.events.size();  // the events this batch records come after
    e.device_done = [out](const std::shared_ptr<DeviceEvent>& ev) {
      out->device_done = ev != nullptr;
    };
    e.done = [out, &ops, first_event](const Status& s, const std::vector<int64_t>&) {
      out->done = true;
      out->error = s.message();
      for (size_t i = first_event; i < ops.events.size(); ++i) {
        if (!ops.events[i]->ran) out->queued_at_done = true;
      }
    };
    Request q;
    q.op = OpType::kAllreduce;
    q.name = name;
    q.rank = 0;
    q.dtype = DataType::kFloat32;
    q.shape = {4};
    q.device = 0;
    queue.Add({std::move(e)}, {q});
    std::vector<Request> popped;
    queue.PopRequests(&popped);
    executor.Run({BuildResponse({&q}, {0})}, false);
  };
  {
    py::gil_scoped_release nogil;
    run("a", &data_a, &a);
    ops.fail_first = true;
    if (poll) executor.PollDevice();  // finds a's failure: the next device batch reports it
    ops.hung = hung;
    run("b", &data_b, &b);
  }
  py::dict result;
  for (const auto& [name, o] : {std::pair<const char*, Outcome*>{"a", &a}, {"b", &b}}) {
    py::dict d;
    d["done"] = o->done;
    d["error"] = o->error;
    d["device_done"] = o->device_done;
    d["queued_at_done"] = o->queued_at_done;
    result[name] = d;
  }
  result["aborted"] = ops.aborted;
  result["synced_while_hung"] = ops.synced_while_hung;
  return result;
}

}  // namespace

void RegisterStreamFailureTesting(py::module_& m) {
  m.def("stream_failure_script", &StreamFailureScript, py::arg("poll"), py::arg("hung") = false);
}

}  // namespace hvdl
