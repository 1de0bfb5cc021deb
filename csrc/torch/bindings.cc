// One binding per operation; dtype is dispatched at run time inside the core (STYLE rule 11).
// Every enqueue_* validates its arguments (ValueError now, nothing enqueued), builds one
// TensorEntry + Request per tensor and submits them as one handle. wait() blocks with the GIL
// released and returns (outputs, extra).
#include "torch/bindings.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>

#include "common/errors.h"
#include "torch/adapter.h"
#include "torch/grad_reducer.h"
#include "torch/stream_sync.h"
#include "torch/submit.h"

namespace py = pybind11;

namespace hvdl {
namespace {

// Set once by RegisterTorchOps, before any binding can run.
TorchOpsHost g_host;

Context& Ctx() { return g_host.context(); }

// How the reducer waits for handles from a Python call: without the GIL.
void WithoutGil(const std::function<void()>& wait) {
  py::gil_scoped_release nogil;
  wait();
}

void CheckLists(OpType op, const std::vector<at::Tensor>& inputs,
                const std::vector<std::string>& names) {
  if (inputs.empty() || inputs.size() != names.size()) {
    ThrowIfError(Status::InvalidArgument(std::string(OpTypeName(op)) +
                                         ": expected one name per tensor and at least one "
                                         "tensor."));
  }
  for (size_t i = 0; i < inputs.size(); ++i) ThrowIfError(CheckTensor(inputs[i], OpTypeName(op), names[i]));
  ThrowIfError(CheckSameDevice(inputs, OpTypeName(op), names));
}

void CheckOutputs(OpType op, const std::vector<at::Tensor>& inputs,
                  const std::vector<at::Tensor>& outputs, const std::vector<std::string>& names) {
  if (outputs.size() != inputs.size()) {
    ThrowIfError(Status::InvalidArgument(std::string(OpTypeName(op)) +
                                         ": expected one output per input."));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    const at::Tensor& o = outputs[i];
    if (o.is_same(inputs[i])) continue;  // in place: the input was checked
    ThrowIfError(CheckTensor(o, OpTypeName(op), names[i]));
    if (o.scalar_type() != inputs[i].scalar_type() || !o.sizes().equals(inputs[i].sizes())) {
      ThrowIfError(Status::InvalidArgument(What(op, names[i]) +
                                           ": the output must match the input's dtype and shape."));
    }
    if (o.device() != inputs[i].device()) {
      ThrowIfError(Status::InvalidArgument(What(op, names[i]) + ": the output is on " +
                                           o.device().str() + " but the input on " +
                                           inputs[i].device().str() + "; use one device."));
    }
  }
}

int EnqueueAllreduce(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                     std::vector<std::string> names, int op, double prescale, double postscale,
                     int ps, std::vector<std::string> sites) {
  Context& ctx = Ctx();
  CheckLists(OpType::kAllreduce, inputs, names);
  CheckOutputs(OpType::kAllreduce, inputs, outputs, names);
  for (size_t i = 0; i < inputs.size(); ++i) CheckAllreduceOp(op, inputs[i], names[i]);
  CheckMembership(ctx, ps, OpType::kAllreduce, names[0]);
  return Submit(ctx, ReductionSpec(OpType::kAllreduce, op, prescale, postscale, ps), inputs,
                outputs, names, sites);
}

// allreduce_async_ of one tensor, in place: SubmitAllreduceInplace after the argument checks.
int EnqueueAllreduceInplace(const at::Tensor& tensor, std::string name, int op, double prescale,
                            double postscale, int ps, std::string site) {
  Context& ctx = Ctx();
  ThrowIfError(CheckTensor(tensor, OpTypeName(OpType::kAllreduce), name));
  CheckAllreduceOp(op, tensor, name);
  CheckMembership(ctx, ps, OpType::kAllreduce, name);
  return SubmitAllreduceInplace(ctx,
                                ReductionSpec(OpType::kAllreduce, op, prescale, postscale, ps),
                                tensor, std::move(name), std::move(site));
}

int EnqueueAllgather(std::vector<at::Tensor> inputs, std::vector<std::string> names, int ps,
                     std::vector<std::string> sites) {
  Context& ctx = Ctx();
  CheckLists(OpType::kAllgather, inputs, names);
  CheckMembership(ctx, ps, OpType::kAllgather, names[0]);
  OpSpec spec;
  spec.op = OpType::kAllgather;
  spec.process_set = ps;
  return Submit(ctx, spec, inputs, {}, names, sites);
}

int EnqueueBroadcast(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                     std::vector<std::string> names, int root, int ps,
                     std::vector<std::string> sites) {
  Context& ctx = Ctx();
  CheckLists(OpType::kBroadcast, inputs, names);
  CheckOutputs(OpType::kBroadcast, inputs, outputs, names);
  CheckMembership(ctx, ps, OpType::kBroadcast, names[0]);
  if (ctx.process_sets().RankIn(ps, root) < 0) {
    ThrowIfError(Status::InvalidArgument(What(OpType::kBroadcast, names[0]) + ": root_rank " +
                                         std::to_string(root) + " is not a member of process set " +
                                         std::to_string(ps) + "."));
  }
  OpSpec spec;
  spec.op = OpType::kBroadcast;
  spec.root = root;
  spec.process_set = ps;
  return Submit(ctx, spec, inputs, outputs, names, sites);
}

int EnqueueAlltoall(at::Tensor input, std::vector<int64_t> splits, std::string name, int ps,
                    std::string site) {
  Context& ctx = Ctx();
  CheckLists(OpType::kAlltoall, {input}, {name});
  CheckMembership(ctx, ps, OpType::kAlltoall, name);
  const int n = ctx.process_sets().Size(ps);
  const int64_t rows = input.dim() == 0 ? 1 : input.size(0);
  if (splits.empty()) {
    if (rows % n != 0) {
      ThrowIfError(Status::InvalidArgument(What(OpType::kAlltoall, name) + ": dimension 0 (" +
                                           std::to_string(rows) + ") is not divisible by the " +
                                           std::to_string(n) + " ranks; pass splits."));
    }
    splits.assign(static_cast<size_t>(n), rows / n);
  }
  int64_t sum = 0;
  for (int64_t s : splits) {
    if (s < 0) ThrowIfError(Status::InvalidArgument(What(OpType::kAlltoall, name) + ": splits must be >= 0."));
    sum += s;
  }
  if (static_cast<int>(splits.size()) != n || sum > rows) {
    ThrowIfError(Status::InvalidArgument(
        What(OpType::kAlltoall, name) + ": splits " + ShapeString(splits) + " must have one entry per rank (" +
        std::to_string(n) + ") and sum to at most dimension 0 (" + std::to_string(rows) + ")."));
  }
  OpSpec spec;
  spec.op = OpType::kAlltoall;
  spec.process_set = ps;
  spec.splits = splits;
  return Submit(ctx, spec, {input}, {}, {name}, {site});
}

int EnqueueReducescatter(std::vector<at::Tensor> inputs, std::vector<std::string> names, int op,
                         double prescale, double postscale, int ps,
                         std::vector<std::string> sites) {
  Context& ctx = Ctx();
  CheckLists(OpType::kReducescatter, inputs, names);
  if (op != static_cast<int>(ReduceOp::kAverage) && op != static_cast<int>(ReduceOp::kSum)) {
    ThrowIfError(Status::InvalidArgument(What(OpType::kReducescatter, names[0]) +
                                         ": only Average and Sum are supported."));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dim() == 0) {
      ThrowIfError(Status::InvalidArgument(What(OpType::kReducescatter, names[i]) +
                                           ": a 0-d tensor cannot be scattered; it needs a "
                                           "first dimension."));
    }
  }
  CheckMembership(ctx, ps, OpType::kReducescatter, names[0]);
  return Submit(ctx, ReductionSpec(OpType::kReducescatter, op, prescale, postscale, ps), inputs,
                {}, names, sites);
}

// Ops without tensors: barrier, join, process-set changes.
int EnqueueControl(OpType op, const std::string& name, int ps, std::vector<int64_t> args) {
  Context& ctx = Ctx();
  if (op == OpType::kBarrier) CheckMembership(ctx, ps, op, name);
  auto payload = std::make_shared<TorchPayload>();
  TensorEntry e;
  e.name = name;
  e.op = op;
  e.process_set = ps;
  e.done = [payload](const Status& s, const std::vector<int64_t>& extra) {
    if (s.ok()) payload->extra = extra;
  };
  Request q;
  q.op = op;
  q.name = name;
  q.process_set = ps;
  q.splits = std::move(args);
  int handle = 0;
  ThrowIfError(ctx.Submit({std::move(e)}, {std::move(q)}, payload, &handle));
  return handle;
}

// Blocks (GIL released) until `handle` completes; raises its error; makes the caller's CUDA
// stream wait for the outputs.
std::shared_ptr<TorchPayload> WaitPayload(int handle) {
  HandleTable& handles = *g_host.handles;
  std::shared_ptr<TorchPayload> payload;
  bool done = false;
  Status status = handles.Poll(handle, &done);
  if (status.ok() && done) {
    // Already complete (all but the first of a fused batch synchronized in a row): Wait returns
    // at once, so the GIL is kept - releasing and retaking it cost more than the rest of wait().
    status = WaitForHandle(handles, handle, &payload);
  } else if (status.ok()) {
    py::gil_scoped_release nogil;
    status = WaitForHandle(handles, handle, &payload);
  }
  ThrowIfError(status);
  return payload;
}

py::tuple Wait(int handle) {
  auto p = WaitPayload(handle);
  return py::make_tuple(p->outputs, p->extra);
}

// A Python object held from C++ state that autograd's threads may drop last: released with the
// GIL taken.
std::shared_ptr<py::object> HoldWithGil(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// DistributedOptimizer's C++ gradient path (grad_reducer.h). `call_site()` returns the user's
// file:line; `errors` maps C++ exceptions to the classes the module registered.
std::shared_ptr<GradReducer> MakeGradReducer(int op, double prescale, double postscale, int ps,
                                             int passes, py::object call_site,
                                             py::handle argument_error, py::handle internal_error) {
  GradReducer::Hooks hooks;
  hooks.context = g_host.context;
  hooks.handles = g_host.handles;
  auto site = HoldWithGil(std::move(call_site));
  hooks.call_site = [site]() -> std::string {
    py::gil_scoped_acquire gil;
    try {
      return (*site)().cast<std::string>();
    } catch (py::error_already_set&) {
      return std::string();  // no call site is no reason to fail the step
    }
  };
  hooks.raise = [argument_error, internal_error](std::exception_ptr error) {
    PyObject* type = PyExc_RuntimeError;
    std::string message;
    try {
      std::rethrow_exception(error);
    } catch (const ArgumentError& e) {
      type = argument_error.ptr();
      message = e.what();
    } catch (const InternalError& e) {
      type = internal_error.ptr();
      message = e.what();
    } catch (const std::exception& e) {
      message = e.what();
    }
    py::gil_scoped_acquire gil;
    PyErr_SetString(type, message.c_str());
    throw py::error_already_set();  // autograd carries it to backward()'s caller
  };
  return std::make_shared<GradReducer>(std::move(hooks), op, prescale, postscale, ps, passes);
}

void RegisterGradReducer(py::module_& m) {
  py::handle argument_error = m.attr("HorovodArgumentError");
  py::handle internal_error = m.attr("HorovodInternalError");
  py::class_<GradReducer, std::shared_ptr<GradReducer>>(m, "GradReducer")
      .def(py::init([argument_error, internal_error](int op, double prescale, double postscale,
                                                     int ps, int passes, py::object call_site) {
             return MakeGradReducer(op, prescale, postscale, ps, passes, std::move(call_site),
                                    argument_error, internal_error);
           }),
           py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("process_set"),
           py::arg("passes"), py::arg("call_site"))
      .def("add", &GradReducer::Add, py::arg("param"), py::arg("name"), py::arg("negotiated"))
      .def("detach", &GradReducer::Detach)
      .def("remove", &GradReducer::Remove, py::arg("index"))
      .def_static("subscribers_on", &GradReducer::SubscribersOn, py::arg("param"))
      .def("set_device", &GradReducer::SetDevice, py::arg("device"))
      .def("set_passes", &GradReducer::SetPasses, py::arg("passes"))
      .def("reset_counters", &GradReducer::ResetCounters)
      .def("launch_missing", [](GradReducer& r) { return r.LaunchMissing(WithoutGil); })
      .def("wait_all", [](GradReducer& r) { return r.WaitAll(WithoutGil); })
      .def("abandon", &GradReducer::Abandon)
      .def("in_flight", &GradReducer::InFlight)
      .def("num_in_flight", &GradReducer::num_in_flight)
      .def("fired", &GradReducer::fired)
      .def("set_buckets", &GradReducer::SetBuckets, py::arg("members"), py::arg("negotiated"),
           py::arg("labels"))
      .def("clear_buckets", &GradReducer::ClearBuckets)
      .def("set_send_buckets_now", &GradReducer::SetSendBucketsNow, py::arg("now"))
      .def("ready_order", &GradReducer::ReadyOrder)
      .def("layout_key", &GradReducer::LayoutKey)
      .def("bucket_report", [](const GradReducer& r) {
        py::list out;
        for (const auto& b : r.BucketReport()) {
          py::dict d;
          d["name"] = b.name;
          d["bytes"] = b.bytes;
          d["members"] = b.members;
          d["views"] = b.views;
          d["copies"] = b.copies;
          d["own"] = b.own;
          d["fallback_steps"] = b.fallback_steps;
          d["fallback"] = b.fallback;
          out.append(d);
        }
        return out;
      });
  m.def("too_many_passes_message", &TooManyPassesMessage, py::arg("name"), py::arg("passes"));
}

}  // namespace

void RegisterTorchOps(py::module_& m, TorchOpsHost host) {
  g_host = std::move(host);
  m.def("enqueue_allreduce", &EnqueueAllreduce, py::arg("inputs"), py::arg("outputs"),
        py::arg("names"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("process_set"), py::arg("sites"));
  m.def("enqueue_allreduce_", &EnqueueAllreduceInplace, py::arg("tensor"), py::arg("name"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("process_set"),
        py::arg("site"));
  m.def("enqueue_allgather", &EnqueueAllgather, py::arg("inputs"), py::arg("names"),
        py::arg("process_set"), py::arg("sites"));
  m.def("enqueue_broadcast", &EnqueueBroadcast, py::arg("inputs"), py::arg("outputs"),
        py::arg("names"), py::arg("root"), py::arg("process_set"), py::arg("sites"));
  m.def("enqueue_alltoall", &EnqueueAlltoall, py::arg("input"), py::arg("splits"),
        py::arg("name"), py::arg("process_set"), py::arg("site"));
  m.def("enqueue_reducescatter", &EnqueueReducescatter, py::arg("inputs"), py::arg("names"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"), py::arg("process_set"),
        py::arg("sites"));
  m.def("enqueue_barrier", [](const std::string& name, int ps) {
    return EnqueueControl(OpType::kBarrier, name, ps, {});
  }, py::arg("name"), py::arg("process_set"));
  m.def("enqueue_join", [] { return EnqueueControl(OpType::kJoin, "join", 0, {}); });
  m.def("enqueue_add_process_set", [](std::vector<int64_t> ranks) {
    std::string name = "process_set.add" + ShapeString(ranks);
    return EnqueueControl(OpType::kProcessSetAdd, name, 0, std::move(ranks));
  }, py::arg("ranks"));
  m.def("enqueue_remove_process_set", [](int id) {
    return EnqueueControl(OpType::kProcessSetRemove, "process_set.remove." + std::to_string(id),
                          0, {id});
  }, py::arg("id"));
  m.def("wait", &Wait, py::arg("handle"));
  // wait() for ops whose result Python already holds (in place): no lists built
  m.def("wait_done", [](int handle) { WaitPayload(handle); }, py::arg("handle"));
  m.def("process_set_ranks", [](int id) {
    auto members = Ctx().process_sets().Members(id);
    if (!members) ThrowIfError(Status::InvalidArgument("process set " + std::to_string(id) + " does not exist."));
    return *members;
  }, py::arg("id"));
  m.def("process_set_ids", [] { return Ctx().process_sets().Ids(); });
  m.def("dynamic_process_sets", [] { return Ctx().dynamic_process_sets(); });
  RegisterGradReducer(m);
}

}  // namespace hvdl
