// Building and enqueueing ops from at::Tensors: what the enqueue_* bindings (bindings.cc) and
// DistributedOptimizer's gradient hooks (grad_reducer.cc) have in common. Every function here
// throws the binding boundary's exceptions (common/errors.h): ArgumentError for a bad argument,
// found before anything was enqueued, InternalError otherwise.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/context.h"
#include "core/handle_table.h"
#include "torch/adapter.h"

namespace hvdl {

// One op's arguments besides its tensors and names.
struct OpSpec {
  OpType op = OpType::kAllreduce;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int root = -1;
  int process_set = 0;
  std::vector<int64_t> splits;
};

// "<op> '<name>'", as errors name a tensor.
std::string What(OpType op, const std::string& name);

// ArgumentError unless process set `ps` exists and this rank belongs to it.
void CheckMembership(Context& ctx, int ps, OpType op, const std::string& name);

// ArgumentError unless `op` can reduce `t` here (Adasum is handled in Python).
void CheckAllreduceOp(int op, const at::Tensor& t, const std::string& name);

// An allreduce's or a reducescatter's spec: the reduce op (an int from Python), scale factors,
// process set.
OpSpec ReductionSpec(OpType type, int op, double prescale, double postscale, int ps);

// Enqueues one op over `inputs` (outputs: in place or given, or empty: allocated once sizes are
// negotiated) as one handle; returns the handle. The tensors were checked already.
int Submit(Context& ctx, const OpSpec& spec, const std::vector<at::Tensor>& inputs,
           const std::vector<at::Tensor>& outputs, const std::vector<std::string>& names,
           const std::vector<std::string>& sites);

// Submit for one tensor reduced in place (allreduce_async_, every gradient): no lists built,
// the name and the call site moved in. `tensor` was checked already (CheckTensor).
int SubmitAllreduceInplace(Context& ctx, const OpSpec& spec, const at::Tensor& tensor,
                           std::string name, std::string site);

// Submit for one host tensor reduced in place that lives in `parts` (same dtype, contiguous,
// in order): negotiated as `name`, one tensor of their total size, and reduced where the parts
// are (TensorEntry::pieces). What a gradient bucket sends when its gradients are tensors of
// their own: a rank whose gradients are the bucket's views sends the same op on the flat tensor.
int SubmitAllreducePieces(Context& ctx, const OpSpec& spec, const std::vector<at::Tensor>& parts,
                          std::string name, std::string site);

// Blocks until `handle` completes (call it without the GIL), then makes the caller's CUDA stream
// wait for the op's outputs. Returns the op's status, or why the handle is unknown; `*payload` is
// the handle's payload (null when unknown).
Status WaitForHandle(HandleTable& handles, int handle, std::shared_ptr<TorchPayload>* payload);

}  // namespace hvdl
