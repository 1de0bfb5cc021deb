#include "torch/grad_reducer.h"

#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>
#include <utility>

#include "common/errors.h"
#include "torch/grad_reducer_state.h"

namespace hvdl {
std::string TooManyPassesMessage(const std::string& param_name, int passes) {
  return "DistributedOptimizer: parameter '" + param_name + "' received more than "
         "backward_passes_per_step=" + std::to_string(passes) + " gradients before "
         "optimizer.step()/synchronize(); its allreduce has already started. Call "
         "optimizer.step() every backward_passes_per_step backward passes (also at the end of an "
         "epoch), or raise backward_passes_per_step.";
}

GradReducer::GradReducer(Hooks hooks, int reduce_op, double prescale, double postscale,
                         int process_set, int passes)
    : hooks_(std::move(hooks)),
      spec_(ReductionSpec(OpType::kAllreduce, reduce_op, prescale, postscale, process_set)),
      passes_(passes) {}

GradReducer::~GradReducer() {
  // May run inside this reducer's own hook (AccumulatorSubscribers::Notify held the last
  // reference) or on any thread: only subscriber lists are touched, never a node's hooks.
  Detach();
  for (Param& p : params_) {  // nobody will wait for these: forget them
    if (p.handle != 0 && hooks_.handles != nullptr) hooks_.handles->Release(p.handle);
  }
  for (Bucket& b : buckets_) {
    if (b.handle != 0 && hooks_.handles != nullptr) hooks_.handles->Release(b.handle);
  }
}

int GradReducer::Add(const at::Tensor& param, std::string param_name, std::string negotiated) {
  Param p;
  p.tensor = param;
  p.accumulator = torch::autograd::impl::grad_accumulator(param);
  if (!p.accumulator) {
    ThrowIfError(Status::InvalidArgument("DistributedOptimizer: parameter '" + param_name +
                                         "' does not require grad or is not a leaf; only leaves "
                                         "that require grad can be hooked."));
  }
  p.name = std::move(param_name);
  p.negotiated = std::move(negotiated);
  std::lock_guard<std::mutex> lock(mu_);
  const int index = static_cast<int>(params_.size());
  p.remaining = passes_;
  if (!detached_) SubscribeLocked(p, index);
  params_.push_back(std::move(p));
  return index;
}

void GradReducer::SubscribeLocked(Param& p, int index) {
  p.subscribers = AccumulatorSubscribers::Of(*p.accumulator);
  p.subscribers->Subscribe(this, weak_from_this(), index);
}

void GradReducer::UnsubscribeLocked(Param& p) {
  if (p.subscribers) {
    const int index = static_cast<int>(&p - params_.data());
    p.subscribers->Unsubscribe(this, index);
  }
  p.subscribers.reset();
  p.accumulator = Accumulator();
}

void GradReducer::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  if (detached_) return;
  detached_ = true;
  for (Param& p : params_) UnsubscribeLocked(p);
}

void GradReducer::Remove(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < 0 || static_cast<size_t>(index) >= params_.size()) {
    ThrowIfError(Status::InvalidArgument("GradReducer.remove: no parameter " +
                                         std::to_string(index)));
  }
  Param& p = params_[static_cast<size_t>(index)];
  p.active = false;
  UnsubscribeLocked(p);
}

int GradReducer::SubscribersOn(const at::Tensor& param) {
  Accumulator acc = torch::autograd::impl::try_get_grad_accumulator(param);
  if (!acc) return 0;
  auto subscribers = AccumulatorSubscribers::Find(*acc);
  return subscribers ? static_cast<int>(subscribers->size()) : 0;
}

void GradReducer::RehookLocked() {
  if (detached_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.active) continue;
    // The node autograd uses for this tensor now: ours unless torch dropped it (set_data with
    // another dtype or device), in which case it is null or a newer one.
    Accumulator current = torch::autograd::impl::try_get_grad_accumulator(p.tensor);
    if (current == p.accumulator || !p.tensor.requires_grad()) continue;
    if (!current) current = torch::autograd::impl::grad_accumulator(p.tensor);
    if (!current) continue;
    UnsubscribeLocked(p);  // the old node is torch's no more: its hook is left to die with it
    p.accumulator = std::move(current);
    SubscribeLocked(p, static_cast<int>(i));
  }
}

void GradReducer::SetDevice(int device) {
  std::lock_guard<std::mutex> lock(mu_);
  device_ = device;
}

void GradReducer::SetPasses(int passes) {
  std::lock_guard<std::mutex> lock(mu_);
  passes_ = passes;
  ResetLocked();
}

void GradReducer::ResetCounters() {
  std::lock_guard<std::mutex> lock(mu_);
  ResetLocked();
}

void GradReducer::ResetLocked() {
  RehookLocked();  // the callers are the safe points (zero_grad, synchronize)
  for (Param& p : params_) {
    p.remaining = passes_;
    p.deferred = false;
    p.bucket_ready = false;
  }
  for (Bucket& b : buckets_) {
    if (b.ready > 0 || b.broken || b.copies > 0) {
      b.last_copies = b.copies;
      b.last_own = b.own;
    }
    // Every member was reduced in a tensor of its own (zero_grad(set_to_none=True) each step):
    // the flat tensor only holds stale values. Released, so gradients take their bytes once;
    // from now on the members are reduced wherever autograd puts them (never copied).
    if (b.flat.defined() && b.device.is_cpu() && !b.broken && b.ready > 0 &&
        b.own == static_cast<int>(b.members.size())) {
      b.flat = at::Tensor();
      for (int i : b.members) params_[static_cast<size_t>(i)].view = at::Tensor();
    }
    for (int i : b.members) params_[static_cast<size_t>(i)].own = false;
    b.own = 0;
    b.ready = 0;
    b.broken = false;
    b.copies = 0;
    b.streams.clear();
  }
  if (!order_.empty()) last_order_ = std::move(order_);
  order_.clear();
  fired_ = false;
  site_fetched_ = false;
  site_.clear();
}

bool GradReducer::EligibleLocked(const Param& p, const at::Tensor& grad) const {
  if (p.sparse_seen || !grad.defined() || grad.is_sparse() || !grad.is_contiguous()) return false;
  return !grad.is_cuda() || grad.get_device() == device_;
}

GradReducer::Outcome GradReducer::LaunchLocked(Param& p, std::exception_ptr* error) {
  const at::Tensor& grad = p.tensor.grad();
  if (grad.defined() && grad.is_sparse()) p.sparse_seen = true;
  if (!EligibleLocked(p, grad)) {
    p.deferred = true;
    return Outcome::kDeferred;
  }
  try {
    Context& ctx = hooks_.context();
    ThrowIfError(CheckTensor(grad, "allreduce", p.negotiated));
    CheckMembership(ctx, spec_.process_set, OpType::kAllreduce, p.negotiated);
    p.handle = SubmitAllreduceInplace(ctx, spec_, grad, p.negotiated, site_);
    ++in_flight_;
    return Outcome::kLaunched;
  } catch (...) {
    *error = std::current_exception();
    return Outcome::kFailed;
  }
}

void GradReducer::FetchSiteOnce() {
  if (site_fetched_.exchange(true)) return;
  std::string site = hooks_.call_site ? hooks_.call_site() : std::string();
  std::lock_guard<std::mutex> lock(mu_);
  site_ = std::move(site);
}

void GradReducer::OnGradReady(int index) {
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (detached_) return;
    Param& p = params_[static_cast<size_t>(index)];
    if (!p.active || !p.tensor.requires_grad()) return;
    if (p.remaining == 0) {
      error = std::make_exception_ptr(std::runtime_error(TooManyPassesMessage(p.name, passes_)));
    } else {
      fired_ = true;
      if (--p.remaining > 0) return;
      if (!site_fetched_.load()) {  // the step's first launch: the call site, GIL taken once
        lock.unlock();
        FetchSiteOnce();
        lock.lock();
        if (detached_) return;
      }
      ReadyLocked(index, &error);
    }
  }
  if (error) hooks_.raise(error);
}

std::vector<int> GradReducer::LaunchMissing() {
  FetchSiteOnce();
  std::vector<int> deferred;
  std::lock_guard<std::mutex> lock(mu_);
  if (detached_) return deferred;
  LaunchMissingBucketsLocked();
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.active || p.handle != 0 || !p.tensor.requires_grad()) continue;
    if (p.bucket >= 0 && !buckets_[static_cast<size_t>(p.bucket)].broken) continue;  // went out
    if (!p.deferred && !p.sparse_seen && !p.tensor.grad().defined()) {
      // Unused on this rank: the other ranks wait for its allreduce, so it sends zeros.
      p.tensor.mutable_grad() = at::zeros_like(p.tensor, at::MemoryFormat::Contiguous);
    }
    std::exception_ptr failed;
    if (p.deferred || LaunchLocked(p, &failed) == Outcome::kDeferred) {
      deferred.push_back(static_cast<int>(i));
    } else if (failed && !launch_error_) {
      launch_error_ = failed;  // WaitAll raises it; the rest still go out (other ranks wait)
    }
  }
  return deferred;
}

void GradReducer::WaitAll(const std::function<void(const std::function<void()>&)>& release_gil) {
  std::vector<int> handles;
  std::exception_ptr launch_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Param& p : params_) {
      if (p.handle != 0) handles.push_back(std::exchange(p.handle, 0));
    }
    for (Bucket& b : buckets_) {
      if (b.handle != 0) handles.push_back(std::exchange(b.handle, 0));
    }
    in_flight_ = 0;
    launch_error = std::exchange(launch_error_, nullptr);
    ResetLocked();
  }
  Status first;
  auto wait_all = [&] {
    for (int h : handles) {
      std::shared_ptr<TorchPayload> payload;
      Status s = WaitForHandle(*hooks_.handles, h, &payload);
      if (!s.ok() && first.ok()) first = s;
    }
  };
  if (!handles.empty()) release_gil(wait_all);
  if (launch_error) std::rethrow_exception(launch_error);
  ThrowIfError(first);
}

void GradReducer::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Param& p : params_) {
    if (p.handle != 0) hooks_.handles->Release(std::exchange(p.handle, 0));
  }
  for (Bucket& b : buckets_) {
    if (b.handle != 0) hooks_.handles->Release(std::exchange(b.handle, 0));
  }
  in_flight_ = 0;
  launch_error_ = nullptr;
  ResetLocked();
}

std::vector<int> GradReducer::InFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Param& p = params_[i];
    if (p.handle != 0 || (p.bucket >= 0 && buckets_[static_cast<size_t>(p.bucket)].handle != 0)) {
      out.push_back(static_cast<int>(i));
    }
  }
  return out;
}

int GradReducer::num_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

bool GradReducer::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

}  // namespace hvdl
