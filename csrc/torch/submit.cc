#include "torch/submit.h"

#include <ATen/ops/empty.h>

#include "common/errors.h"
#include "torch/stream_sync.h"

namespace hvdl {
namespace {

// The request every rank sends for an op's tensor `name` (negotiated by name, shape and dtype).
Request MakeRequest(const OpSpec& spec, std::string name, DataType dtype, const TensorRef& input,
                    std::string site) {
  Request q;
  q.op = spec.op;
  q.name = std::move(name);
  q.dtype = dtype;
  q.shape = input.shape;
  q.reduce_op = spec.reduce_op;
  q.prescale = spec.prescale;
  q.postscale = spec.postscale;
  q.root = spec.root;
  q.device = input.device;
  q.process_set = spec.process_set;
  q.splits = spec.splits;
  q.site = std::move(site);
  return q;
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
      payload->AddFinished(finished);
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
  payload->storages.push_back(in.storage());  // (adapter.h: TorchPayload::storages)
  if (out != nullptr && !out->is_same(in)) payload->storages.push_back(out->storage());
  e.keepalive = payload;  // the tensors stay alive until the op completes, handle or not
  if (spec.op == OpType::kAlltoall) {  // the only op here with extra results: received splits
    e.done = [payload](const Status& s, const std::vector<int64_t>& extra) {
      if (s.ok() && !extra.empty()) payload->extra = extra;
    };
  }
  requests->push_back(MakeRequest(spec, std::move(name), dtype, e.input, std::move(site)));
  entries->push_back(std::move(e));
}

// CUDA: one ready event for the op (CheckSameDevice: all its tensors share a device).
std::shared_ptr<DeviceEvent> ReadyEvent(const at::Tensor& first) {
  std::shared_ptr<DeviceEvent> ready;
  if (first.is_cuda()) ThrowIfError(MarkCallerStream(first.get_device(), &ready));
  return ready;
}

}  // namespace

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

OpSpec ReductionSpec(OpType type, int op, double prescale, double postscale, int ps) {
  OpSpec spec;
  spec.op = type;
  spec.reduce_op = static_cast<ReduceOp>(op);
  spec.prescale = prescale;
  spec.postscale = postscale;
  spec.process_set = ps;
  return spec;
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

int SubmitAllreduceInplace(Context& ctx, const OpSpec& spec, const at::Tensor& tensor,
                           std::string name, std::string site) {
  auto payload = std::make_shared<TorchPayload>();
  payload->outputs.push_back(tensor);  // wait() returns it (Adasum's finish reads it)
  std::vector<TensorEntry> entries;
  std::vector<Request> requests;
  entries.reserve(1);
  requests.reserve(1);
  AddTensor(spec, payload, ReadyEvent(tensor), tensor,
            &tensor, 0, std::move(name), std::move(site), &entries, &requests);
  int handle = 0;
  ThrowIfError(ctx.Submit(std::move(entries), std::move(requests), payload, &handle));
  return handle;
}

int SubmitAllreducePieces(Context& ctx, const OpSpec& spec, const std::vector<at::Tensor>& parts,
                          std::string name, std::string site) {
  auto payload = std::make_shared<TorchPayload>();
  payload->inputs = parts;  // alive until the op completes
  DataType dtype;
  ThrowIfError(ToDataType(parts.front(), &dtype));
  TensorEntry e;
  e.name = name;
  e.op = OpType::kAllreduce;
  e.process_set = spec.process_set;
  int64_t total = 0;
  for (const at::Tensor& t : parts) {
    payload->storages.push_back(t.storage());
    if (t.numel() == 0) continue;
    e.pieces.push_back(Span{t.data_ptr(), t.numel()});
    total += t.numel();
  }
  e.input = ToRef(parts.front(), dtype);
  e.input.data = e.pieces.empty() ? nullptr : e.pieces.front().data;
  e.input.shape = Shape{total};
  e.output = e.input;
  e.keepalive = payload;
  std::vector<Request> requests;
  requests.push_back(MakeRequest(spec, std::move(name), dtype, e.input, std::move(site)));
  std::vector<TensorEntry> entries;
  entries.push_back(std::move(e));
  int handle = 0;
  ThrowIfError(ctx.Submit(std::move(entries), std::move(requests), payload, &handle));
  return handle;
}

Status WaitForHandle(HandleTable& handles, int handle, std::shared_ptr<TorchPayload>* payload) {
  Status op_status;
  std::shared_ptr<void> state;
  HVDL_RETURN_IF_ERROR(handles.Wait(handle, &op_status, &state));
  *payload = std::static_pointer_cast<TorchPayload>(state);
  // The caller's stream waits for the batch's device work on every path, a failed one too: a
  // batch failed with an earlier batch's error (core/device_inflight) still ran and handed its
  // event, and memory the user frees after the error must not be reused while it is queued.
  Status waited;
  for (const auto& finished : (*payload)->Finished()) {
    Status s = WaitOnCallerStream(finished);
    if (waited.ok()) waited = s;
  }
  HVDL_RETURN_IF_ERROR(op_status);
  return waited;
}

}  // namespace hvdl
