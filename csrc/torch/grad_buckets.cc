// GradReducer's buckets (grad_reducer.h, step 6; docs/bucket_views.md): gradients that live in
// the flat tensor their allreduce runs on.
//
// Why a flat tensor per bucket instead of the core's fusion buffer: autograd accumulates into
// the views, and the bucket goes on the wire from that memory, in place, with no copy into a
// fusion buffer and none back, and the gradients need no second home. The layout comes from
// Python, agreed by every rank (horovodlite/torch/buckets.py), so every rank negotiates the same
// names and shapes.
//
// Per step: a member's hook (its last pass) adopts the gradient and counts it; the last member
// launches the bucket. Host memory: a gradient in a tensor of its own (zero_grad(set_to_none=
// True), torch's default, makes autograd allocate one) is reduced where it is, without a copy -
// the bucket goes out as one tensor in pieces (two ranks or fewer, under the bucket's name, as
// the flat tensor would) or as its members' spans (three or more, under their names, as always
// there); a bucket is reduced either in its views or wholly outside them, and one whose members
// all came outside gives its flat tensor up at the end of the step. Device memory: the bucket goes out as its flat tensor, and a
// gradient outside it is copied in once (a device copy) and p.grad becomes the view. A member
// that cannot be adopted breaks the bucket for the step: its members go out one by one on the
// per-gradient path, so the step still reduces every gradient.
//
// CUDA buckets (one device allocation each, allocated like the first member). The per-gradient
// path records a gradient's ready event on the stream current in its hook, which is the stream
// autograd accumulated it on (the engine runs a node's post hooks under that node's stream). A
// bucket is submitted once, from its last member's hook, so its ready event is recorded on that
// member's stream only; members made ready on other streams (a forward that ran layers on side
// streams) are ordered before it here: at the launch the current stream waits (device-side, an
// event recorded on each other stream) for every stream a member became ready on. With one
// stream, the usual case, that is nothing: stream order already puts every member's
// accumulation (and any copy into the view, made on the same stream) before the event.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <string>
#include <utility>

#include "common/errors.h"
#include "torch/grad_reducer.h"
#include "torch/grad_reducer_state.h"

namespace hvdl {
namespace {

// What p.grad is set to: a tensor of its own on the view's memory (the bucket's storage at the
// view's offset), not an autograd view of it. The view itself is never handed out, so
// `p.grad.data = ...` (what module.double() does) or p.grad.set_() cannot turn the view into
// something outside the bucket: the next hook then sees a gradient that is not the view. And
// since it is no autograd view, p.grad.detach_() works as on any gradient (torch refuses to
// detach views in place, which is why DDP's bucket views break code that calls it).
at::Tensor GradAlias(const at::Tensor& view) {
  at::Tensor alias = at::empty({0}, view.options());
  alias.set_(view.storage(), view.storage_offset(), view.sizes(), view.strides());
  return alias;
}

// The current stream of `device` on this thread (a hook's: the stream autograd ran its node on).
c10::Stream CurrentStream(const c10::Device& device) {
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
}

}  // namespace

// Device buckets: the current stream waits for the work queued so far on `streams` (those other
// than itself); then clears them. An event recorded now covers more than the member's
// accumulation (whatever that stream queued since), which only waits longer.
void WaitForStreams(const c10::Device& device, std::vector<c10::Stream>* streams) {
  if (streams->empty()) return;
  const c10::Stream current = CurrentStream(device);
  for (const c10::Stream& s : *streams) {
    if (s == current) continue;
    c10::Event done(device.type());
    done.record(s);
    done.block(current);
  }
  streams->clear();
}

void GradReducer::SetBuckets(const std::vector<std::vector<int>>& members,
                             const std::vector<std::string>& negotiated,
                             const std::vector<std::string>& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  if (members.size() != negotiated.size() || members.size() != labels.size()) {
    ThrowIfError(Status::InvalidArgument("GradReducer.set_buckets: members, names and labels "
                                         "differ in length"));
  }
  for (const Bucket& b : buckets_) {
    if (b.handle != 0) {
      ThrowIfError(Status::InvalidArgument("GradReducer.set_buckets: bucket '" + b.label +
                                           "' has an allreduce in flight; synchronize first"));
    }
  }
  // Check everything before changing anything.
  std::vector<int> seen(params_.size(), 0);
  for (const auto& list : members) {
    if (list.empty()) ThrowIfError(Status::InvalidArgument("GradReducer.set_buckets: empty bucket"));
    const at::Tensor* first = nullptr;
    for (int i : list) {
      if (i < 0 || static_cast<size_t>(i) >= params_.size() || seen[static_cast<size_t>(i)]++) {
        ThrowIfError(Status::InvalidArgument("GradReducer.set_buckets: parameter index " +
                                             std::to_string(i) + " unknown or in two buckets"));
      }
      const Param& p = params_[static_cast<size_t>(i)];
      if (!p.active || !p.tensor.is_contiguous() || p.tensor.is_sparse() ||
          (first != nullptr && (first->scalar_type() != p.tensor.scalar_type() ||
                                first->device() != p.tensor.device()))) {
        ThrowIfError(Status::InvalidArgument(
            "GradReducer.set_buckets: parameter '" + p.name +
            "' cannot share a bucket (removed, not contiguous, or another dtype/device)"));
      }
      if (first == nullptr) first = &p.tensor;
    }
  }
  for (Param& p : params_) {
    p.bucket = -1;
    p.view = at::Tensor();
  }
  buckets_.clear();
  for (size_t k = 0; k < members.size(); ++k) {
    Bucket b;
    b.members = members[k];
    b.negotiated = negotiated[k];
    b.label = labels[k];
    int64_t total = 0;
    for (int i : b.members) total += params_[static_cast<size_t>(i)].tensor.numel();
    const at::Tensor& first = params_[static_cast<size_t>(b.members.front())].tensor;
    b.flat = at::zeros({total}, first.options().memory_format(at::MemoryFormat::Contiguous));
    b.device = first.device();
    b.dtype = first.scalar_type();
    b.bytes = total * static_cast<int64_t>(first.element_size());
    int64_t offset = 0;
    for (int i : b.members) {
      Param& p = params_[static_cast<size_t>(i)];
      const int64_t n = p.tensor.numel();
      p.view = b.flat.narrow(0, offset, n).view(p.tensor.sizes());
      offset += n;
      p.bucket = static_cast<int>(k);
      p.own = false;
      at::Tensor grad = p.tensor.grad();
      // A gradient of the layout's dtype/device/shape moves in (once, at the rebuild); anything
      // else (none, sparse) stays as it is, and the step's hook or LaunchMissing decides.
      if (grad.defined() && !grad.is_sparse() && grad.scalar_type() == p.view.scalar_type() &&
          grad.device() == p.view.device() && grad.sizes() == p.view.sizes()) {
        p.view.copy_(grad);
        p.tensor.mutable_grad() = GradAlias(p.view);
      }
    }
    buckets_.push_back(std::move(b));
  }
}

void GradReducer::ClearBuckets() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Bucket& b : buckets_) {
    if (b.handle != 0 && hooks_.handles != nullptr) hooks_.handles->Release(b.handle);
  }
  for (Param& p : params_) {
    p.bucket = -1;
    p.view = at::Tensor();  // p.grad keeps its value (and keeps the old flat tensor alive)
    p.bucket_ready = false;
    p.own = false;
  }
  buckets_.clear();
}

std::vector<GradReducer::BucketInfo> GradReducer::BucketReport() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<BucketInfo> out;
  for (const Bucket& b : buckets_) {
    BucketInfo info;
    info.name = b.negotiated;
    info.bytes = b.bytes;
    info.members = b.members;
    info.views = b.flat.defined();
    info.copies = b.last_copies;
    info.own = b.last_own;
    info.fallback_steps = b.fallback_steps;
    info.fallback = b.fallback;
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<int> GradReducer::ReadyOrder() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.empty() ? last_order_ : order_;
}

std::vector<int64_t> GradReducer::LayoutKey() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int64_t> key;
  key.reserve(params_.size() * 4);
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (!p.active) continue;
    const c10::Device device = p.tensor.device();
    key.push_back(static_cast<int64_t>(i));
    key.push_back(reinterpret_cast<int64_t>(p.tensor.unsafeGetTensorImpl()));
    key.push_back((p.tensor.requires_grad() ? 1 : 0) |
                  (static_cast<int64_t>(p.tensor.scalar_type()) << 1));
    key.push_back((static_cast<int64_t>(device.type()) << 16) | (device.index() + 1));
  }
  return key;
}

bool GradReducer::AdoptLocked(Param& p, Bucket& b, std::string* reason) {
  const at::Tensor& grad = p.tensor.grad();
  if (!grad.defined()) {
    *reason = "parameter '" + p.name + "' has no gradient";
    return false;
  }
  if (grad.is_sparse()) {
    p.sparse_seen = true;
    *reason = "parameter '" + p.name + "' has a sparse gradient";
    return false;
  }
  if (grad.scalar_type() != b.dtype || grad.device() != b.device ||
      grad.sizes() != (p.view.defined() ? p.view.sizes() : p.tensor.sizes())) {
    *reason = "parameter '" + p.name + "' has a gradient of another dtype, device or shape (" +
              std::string(c10::toString(grad.scalar_type())) + " on " + grad.device().str() +
              ") than its bucket";
    return false;
  }
  if (p.view.defined() && grad.data_ptr() == p.view.data_ptr()) {
    // Autograd accumulated into the view. Members that came in tensors of their own before it
    // move into their views: a bucket is reduced in its views, or (host memory) wholly outside.
    if (b.own > 0) MoveIntoViewsLocked(b);
    return true;
  }
  // A tensor of its own (zero_grad(set_to_none=True) made autograd allocate one, or `p.grad =
  // t`). Host memory: the bucket goes out from wherever its gradients are (one tensor in pieces,
  // or its members' spans; LaunchBucketLocked), so a contiguous one is reduced where it is - no
  // copy - unless a member arrived in its view already this step. A bucket whose members all arrive so gives its flat tensor up at the end
  // of the step (ResetLocked).
  const bool host = b.device.is_cpu();
  if (host && (!b.flat.defined() || b.ready == b.own)) {
    if (!grad.is_contiguous()) {  // one copy, into a contiguous tensor of its own
      p.tensor.mutable_grad() = grad.contiguous();
      ++b.copies;
    }
    p.own = true;
    ++b.own;
    return true;
  }
  // Copied into the view once; from now on autograd accumulates into the view.
  p.view.copy_(grad);
  p.tensor.mutable_grad() = GradAlias(p.view);
  ++b.copies;
  return true;
}

void GradReducer::MoveIntoViewsLocked(Bucket& b) {
  for (int i : b.members) {
    Param& m = params_[static_cast<size_t>(i)];
    if (!m.own) continue;
    m.view.copy_(m.tensor.grad());
    m.tensor.mutable_grad() = GradAlias(m.view);
    m.own = false;
    ++b.copies;
  }
  b.own = 0;
}

void GradReducer::ReadyLocked(int index, std::exception_ptr* error) {
  order_.push_back(index);
  Param& p = params_[static_cast<size_t>(index)];
  if (p.bucket < 0) {
    LaunchLocked(p, error);
    return;
  }
  Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
  p.bucket_ready = true;
  if (!b.device.is_cpu()) {  // where autograd accumulated into the view (and AdoptLocked copied)
    const c10::Stream stream = CurrentStream(b.device);
    if (std::find(b.streams.begin(), b.streams.end(), stream) == b.streams.end()) {
      b.streams.push_back(stream);
    }
  }
  if (b.broken) return;  // its members go out at synchronize, once the ranks agreed
  std::string reason;
  if (!AdoptLocked(p, b, &reason)) {
    const auto at = std::find(b.members.begin(), b.members.end(), index) - b.members.begin();
    BreakLocked(b, static_cast<int>(at), reason);
    return;
  }
  if (++b.ready == static_cast<int>(b.members.size())) LaunchBucketLocked(b, error);
}

void GradReducer::BreakLocked(Bucket& b, int position, const std::string& reason) {
  // Nothing goes out yet: whether this bucket goes out whole or member by member is decided
  // with the other ranks at synchronize (LaunchMissing: SubmitMarkersLocked), and the members
  // go out there, from the user's stream (which first waits for the members' streams).
  if (!b.broken) ++b.fallback_steps;
  b.broken = true;
  if (b.broken_at < 0 || position < b.broken_at) {
    b.broken_at = position;
    b.fallback = reason;
  }
}

void GradReducer::LaunchBucketLocked(Bucket& b, std::exception_ptr* error) {
  try {
    Context& ctx = hooks_.context();
    CheckMembership(ctx, spec_.process_set, OpType::kAllreduce, b.label);
    const bool own_name = UnderItsNameLocked(b);
    // Device buckets: the ready event Submit records on this stream must follow every member.
    if (!b.streams.empty()) WaitForStreams(b.device, &b.streams);
    if (!b.device.is_cpu() || (own_name && b.own == 0 && b.flat.defined())) {
      // The flat tensor, in place, under the bucket's name. Device memory at every rank count: a
      // batch of several device tensors would be packed into the fusion buffer (device plans
      // have no spans); from three ranks on the result may differ from the per-gradient path's
      // in the last bits, as that path's does with what the core happened to fuse. With one or
      // two ranks a + b == b + a: bit-identical whatever the layout.
      b.handle = SubmitAllreduceInplace(ctx, spec_, b.flat, b.negotiated, site_);
    } else if (own_name) {
      // Host, two ranks or fewer, gradients in tensors of their own (every member: AdoptLocked keeps a bucket wholly
      // in its views or wholly outside): the same op under the same name - a rank whose
      // gradients are in the views sends the flat tensor - reduced where the tensors are.
      std::vector<at::Tensor> grads;
      grads.reserve(b.members.size());
      for (int i : b.members) grads.push_back(params_[static_cast<size_t>(i)].tensor.grad());
      b.handle = SubmitAllreducePieces(ctx, spec_, grads, b.negotiated, site_);
    } else {
      // Host, three ranks or more: the ring reduces each tensor in chunks of its own, so where an
      // element sits in its tensor decides the order ranks are added in (comm/allreduce_planner.h:
      // results never depend on fusion). The members go out as the spans of one op, in place
      // wherever they are (the views, or tensors of their own; the ring takes spans without
      // packing them), under their own names: the per-gradient path's rounding and
      // negotiation.
      std::vector<at::Tensor> grads;
      std::vector<std::string> names;
      grads.reserve(b.members.size());
      names.reserve(b.members.size());
      for (int i : b.members) {
        const Param& m = params_[static_cast<size_t>(i)];
        grads.push_back(m.tensor.grad());
        names.push_back(m.negotiated);
      }
      b.handle = Submit(ctx, spec_, grads, grads, names,
                        std::vector<std::string>(grads.size(), site_));
    }
    for (int i : b.members) {
      Param& m = params_[static_cast<size_t>(i)];
      m.sent = true;
      m.sent_data = m.tensor.grad().data_ptr();
      m.sent_version = static_cast<int64_t>(m.tensor.grad()._version());
    }
    in_flight_ += static_cast<int>(b.members.size());
    // A bucket is fused already: holding it back to batch it with later gradients would only
    // delay it to the end of backward, where nothing is left to overlap it with.
    if (send_buckets_now_) ctx.SendNow();
  } catch (...) {
    *error = std::current_exception();
  }
}

void GradReducer::LaunchMissingBucketsLocked() {
  for (Bucket& b : buckets_) {
    if (b.handle != 0 || b.broken) continue;
    std::string reason;
    size_t at = 0;
    for (; at < b.members.size(); ++at) {  // a member frozen or removed since the layout
      const Param& m = params_[static_cast<size_t>(b.members[at])];
      if (!m.active) reason = "parameter '" + m.name + "' left the optimizer";
      if (m.active && !m.tensor.requires_grad()) {
        reason = "parameter '" + m.name + "' does not require grad";
      }
      if (!reason.empty()) break;
    }
    for (size_t k = 0; reason.empty() && k < b.members.size(); ++k) {
      Param& m = params_[static_cast<size_t>(b.members[k])];
      if (m.bucket_ready) continue;
      if (!m.tensor.grad().defined() && !m.sparse_seen) {
        // Unused on this rank: it goes out as zeros (the other ranks reduce theirs), in its
        // slice, or in a tensor of its own where the bucket's members are outside their views.
        if (m.view.defined() && b.own == 0) {
          m.view.zero_();
          m.tensor.mutable_grad() = GradAlias(m.view);
        } else {
          m.tensor.mutable_grad() = at::zeros_like(m.tensor, at::MemoryFormat::Contiguous);
          m.own = true;
          ++b.own;
        }
      } else if (!AdoptLocked(m, b, &reason)) {  // a partial accumulation: adopted as it is
        at = k;
        break;
      }
      m.bucket_ready = true;
      ++b.ready;
    }
    if (!reason.empty()) {
      BreakLocked(b, static_cast<int>(at), reason);
      continue;
    }
    std::exception_ptr failed;
    LaunchBucketLocked(b, &failed);
    if (failed && !launch_error_) launch_error_ = failed;
  }
  for (Bucket& b : buckets_) {
    if (b.broken) SubmitMarkersLocked(b);
  }
}

}  // namespace hvdl
