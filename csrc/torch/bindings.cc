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
#include "torch/stream_sync.h"

namespace py = pybind11;

namespace hvdl {
namespace {

struct OpSpec {
  OpType op = OpType::kAllreduce;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = -1;
  int process_set = 0;
  std::vector<int64_t> splits;
};

// Set once by RegisterTorchOps, before any binding can run.
TorchOpsHost g_host;

Context& Ctx() { return g_host.context(); }

std::string What(OpType op, const std::string& name) {
  return TensorLabel(OpTypeName(op), name);
}

// ValueError unless process set `ps` exists and this rank belongs to it.
void CheckMembership(Context& ctx, int ps, OpType op, const std::string& name) {
  ProcessSetTable& sets = ctx.process_sets();
  if (!sets.Exists(ps)) {
    ThrowIfError(Status::InvalidArgument(What(op, name) + ": process set " + std::to_string(ps) +
                                         " does not exist (never added, or removed)."));
  }
  if (sets.RankIn(ps, ctx.topology().rank) < 0) {
    auto members = sets.Members(ps).value_or(std::vector<int>{});
    ThrowIfError(Status::InvalidArgument(What(op, name) + ": rank " +
                                         std::to_string(ctx.topology().rank) +
                                         " is not in process set " + std::to_string(ps) +
                                         " (ranks " + ShapeString(std::vector<int64_t>(members.begin(), members.end())) +
                                         "); only its members may call collectives on it."));
  }
}

// Adds tensor `i` of an op: its entry (output `out`, or allocated by the background thread when
// null) and its request.
void AddTensor(const OpSpec& spec, const std::shared_ptr<TorchPayload>& payload,
               const std::shared_ptr<DeviceEvent>& ready, const at::Tensor& in,
               const at::Tensor* out, size_t i, std::string name, std::string site,
               std::vector<TensorEntry>* entries, std::vector<Request>* requests) {
  DataType dtype;
  ThrowIfError(ToDataType(in, &dtype));
  TensorEntry e;
  e.name = name;
  e.op = spec.op;
  e.input = ToRef(in, dtype);
  e.process_set = spec.process_set;
  if (ready) {
    e.ready = ready;
    e.device_done = [payload](const std::shared_ptr<DeviceEvent>& finished) {
      if (payload->finished.empty() || payload->finished.back() != finished) {
        payload->finished.push_back(finished);
      }
    };
  }
  if (out == nullptr && ready) {
    at::TensorOptions options = in.options();
    e.allocate = [payload, i, options, dtype, ready](const Shape& shape, TensorRef* o) {
      try {
        HVDL_RETURN_IF_ERROR(AllocateAfter(ready, shape, options, &payload->outputs[i]));
      } catch (const std::exception& ex) {  // e.g. CUDA out of memory: never throw here
        return Status::Internal("allocating the " + DescribeTensor(dtype, shape) + " output on " +
                                options.device().str() + " failed: " + ex.what());
      }
      *o = ToRef(payload->outputs[i], dtype);
      return Status::Ok();
    };
  } else if (out == nullptr) {
    at::TensorOptions options = in.options();
    e.allocate = [payload, i, options, dtype](const Shape& shape, TensorRef* o) {
      payload->outputs[i] = at::empty(shape, options);
      *o = ToRef(payload->outputs[i], dtype);
      return Status::Ok();
    };
  } else {
    e.output = out->is_same(in) ? e.input : ToRef(*out, dtype);
  }
  e.keepalive = payload;  // the tensors stay alive until the op completes, handle or not
  if (spec.op == OpType::kAlltoall) {  // the only op here with extra results: received splits
    e.done = [payload](const Status& s, const std::vector<int64_t>& extra) {
      if (s.ok() && !extra.empty()) payload->extra = extra;
    };
  }
  Request q;
  q.op = spec.op;
  q.name = std::move(name);
  q.dtype = dtype;
  q.shape = e.input.shape;
  q.reduce_op = spec.reduce_op;
  q.prescale = spec.prescale;
  q.postscale = spec.postscale;
  q.root = spec.root;
  q.device = e.input.device;
  q.process_set = spec.process_set;
  q.splits = spec.splits;
  q.site = std::move(site);
  entries->push_back(std::move(e));
  requests->push_back(std::move(q));
}

// CUDA: one ready event for the op (CheckSameDevice: all its tensors share a device).
std::shared_ptr<DeviceEvent> ReadyEvent(const at::Tensor& first) {
  std::shared_ptr<DeviceEvent> ready;
  if (first.is_cuda()) ThrowIfError(MarkCallerStream(first.get_device(), &ready));
  return ready;
}

int Submit(Context& ctx, const OpSpec& spec, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs, const std::vector<std::string>& names,
           const std::vector<std::string>& sites) {
  auto payload = std::make_shared<TorchPayload>();
  payload->inputs = inputs;
  payload->outputs = outputs;
  payload->outputs.resize(inputs.size());
  std::vector<TensorEntry> entries;
  std::vector<Request> requests;
  entries.reserve(inputs.size());
  requests.reserve(inputs.size());
  const std::shared_ptr<DeviceEvent> ready = ReadyEvent(inputs[0]);
  for (size_t i = 0; i < inputs.size(); ++i) {
    AddTensor(spec, payload, ready, inputs[i], outputs.empty() ? nullptr : &outputs[i], i,
              names[i], i < sites.size() ? sites[i] : std::string(), &entries, &requests);
  }
  int handle = 0;
  ThrowIfError(ctx.Submit(std::move(entries), std::move(requests), payload, &handle));
  return handle;
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

// ValueError unless `op` can reduce `t` here (Adasum is handled in Python).
void CheckAllreduceOp(int op, const at::Tensor& t, const std::string& name) {
  if (!IsValidReduceOp(op) || static_cast<ReduceOp>(op) == ReduceOp::kAdasum) {
    ThrowIfError(Status::InvalidArgument(What(OpType::kAllreduce, name) + ": op " +
                                         std::to_string(op) + " is not one of Average, Sum, Min, "
                                         "Max, Product here (Adasum is handled in Python)."));
  }
  if (t.scalar_type() == at::kBool && static_cast<ReduceOp>(op) == ReduceOp::kAverage) {
    ThrowIfError(Status::InvalidArgument(What(OpType::kAllreduce, name) +
                                         ": Average is undefined for bool tensors; use Min "
                                         "(logical and) or Max (logical or)."));
  }
}

OpSpec AllreduceSpec(int op, double prescale, double postscale, int ps) {
  OpSpec spec;
  spec.op = OpType::kAllreduce;
  spec.reduce_op = static_cast<ReduceOp>(op);
  spec.prescale = prescale;
  spec.postscale = postscale;
  spec.process_set = ps;
  return spec;
}

int EnqueueAllreduce(std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                     std::vector<std::string> names, int op, double prescale, double postscale,
                     int ps, std::vector<std::string> sites) {
  Context& ctx = Ctx();
  CheckLists(OpType::kAllreduce, inputs, names);
  CheckOutputs(OpType::kAllreduce, inputs, outputs, names);
  for (size_t i = 0; i < inputs.size(); ++i) CheckAllreduceOp(op, inputs[i], names[i]);
  CheckMembership(ctx, ps, OpType::kAllreduce, names[0]);
  return Submit(ctx, AllreduceSpec(op, prescale, postscale, ps), inputs, outputs, names, sites);
}

// allreduce_async_ of one tensor, in place: the path of every DistributedOptimizer gradient.
// enqueue_allreduce's checks and entry without the one-element lists (one list per argument, a
// copy of each, per gradient): the name and the call site are moved, not copied.
int EnqueueAllreduceInplace(const at::Tensor& tensor, std::string name, int op, double prescale,
                            double postscale, int ps, std::string site) {
  Context& ctx = Ctx();
  ThrowIfError(CheckTensor(tensor, OpTypeName(OpType::kAllreduce), name));
  CheckAllreduceOp(op, tensor, name);
  CheckMembership(ctx, ps, OpType::kAllreduce, name);
  auto payload = std::make_shared<TorchPayload>();
  payload->outputs.push_back(tensor);  // wait() returns it (Adasum's finish reads it)
  std::vector<TensorEntry> entries;
  std::vector<Request> requests;
  entries.reserve(1);
  requests.reserve(1);
  AddTensor(AllreduceSpec(op, prescale, postscale, ps), payload, ReadyEvent(tensor), tensor,
            &tensor, 0, std::move(name), std::move(site), &entries, &requests);
  int handle = 0;
  ThrowIfError(ctx.Submit(std::move(entries), std::move(requests), payload, &handle));
  return handle;
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
  OpSpec spec;
  spec.op = OpType::kReducescatter;
  spec.reduce_op = static_cast<ReduceOp>(op);
  spec.prescale = prescale;
  spec.postscale = postscale;
  spec.process_set = ps;
  return Submit(ctx, spec, inputs, {}, names, sites);
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
  Status status, op_status;
  std::shared_ptr<void> payload;
  HandleTable& handles = *g_host.handles;
  bool done = false;
  status = handles.Poll(handle, &done);
  if (status.ok() && done) {
    // Already complete (all but the first of a fused batch synchronized in a row): Wait returns
    // at once, so the GIL is kept - releasing and retaking it cost more than the rest of wait().
    status = handles.Wait(handle, &op_status, &payload);
  } else if (status.ok()) {
    py::gil_scoped_release nogil;
    status = handles.Wait(handle, &op_status, &payload);
  }
  ThrowIfError(status);
  ThrowIfError(op_status);
  auto p = std::static_pointer_cast<TorchPayload>(payload);
  for (const auto& finished : p->finished) ThrowIfError(WaitOnCallerStream(finished));
  return p;
}

py::tuple Wait(int handle) {
  auto p = WaitPayload(handle);
  return py::make_tuple(p->outputs, p->extra);
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
}

}  // namespace hvdl
