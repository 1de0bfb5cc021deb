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
    b.broken_at = -1;
    b.refused = false;
    for (int h : b.markers) {  // LaunchMissing did not get to wait for them
      if (hooks_.handles != nullptr) hooks_.handles->Release(h);
    }
    b.markers.clear();
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
    p.sent = true;
    p.sent_data = grad.data_ptr();
    p.sent_version = static_cast<int64_t>(grad._version());
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

std::vector<int> GradReducer::LaunchMissing(
    const std::function<void(const std::function<void()>&)>& release_gil) {
  FetchSiteOnce();
  std::vector<int> deferred;
  std::vector<std::pair<size_t, int>> markers;  // (bucket, handle)
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (detached_) return deferred;
    LaunchMissingBucketsLocked();  // broken buckets: markers submitted
    LaunchAloneLocked(false, &deferred);
    for (size_t k = 0; k < buckets_.size(); ++k) {
      for (int h : buckets_[k].markers) markers.emplace_back(k, h);
      buckets_[k].markers.clear();
    }
  }
  if (markers.empty()) return deferred;
  // Every rank sent the broken buckets' markers, or some sent a bucket whole: the core raises
  // that mismatch on every rank, and the members of that bucket do not go out.
  std::vector<Status> results(markers.size());
  release_gil([&] {
    for (size_t k = 0; k < markers.size(); ++k) {
      std::shared_ptr<TorchPayload> payload;
      results[k] = WaitForHandle(*hooks_.handles, markers[k].second, &payload);
    }
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (detached_) return deferred;
  for (size_t k = 0; k < markers.size(); ++k) {
    if (results[k].ok() || markers[k].first >= buckets_.size()) continue;
    Bucket& b = buckets_[markers[k].first];
    if (!b.refused && !launch_error_) launch_error_ = BucketErrorLocked(b, results[k]);
    b.refused = true;
  }
  LaunchAloneLocked(true, &deferred);
  return deferred;
}

void GradReducer::LaunchAloneLocked(bool broken, std::vector<int>* deferred) {
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = params_[i];
    if (!p.active || p.handle != 0 || !p.tensor.requires_grad()) continue;
    if ((p.bucket >= 0) != broken) continue;
    if (broken) {
      Bucket& b = buckets_[static_cast<size_t>(p.bucket)];
      if (!b.broken || b.refused) continue;  // went out whole, or the ranks disagreed
      if (!b.streams.empty()) {  // device: this stream waits for the members' streams
        try {
          WaitForStreams(b.device, &b.streams);
        } catch (...) {
          if (!launch_error_) launch_error_ = std::current_exception();
        }
      }
    }
    if (!p.deferred && !p.sparse_seen && !p.tensor.grad().defined()) {
      // Unused on this rank: the other ranks wait for its allreduce, so it sends zeros.
      p.tensor.mutable_grad() = at::zeros_like(p.tensor, at::MemoryFormat::Contiguous);
    }
    std::exception_ptr failed;
    if (p.deferred || LaunchLocked(p, &failed) == Outcome::kDeferred) {
      deferred->push_back(static_cast<int>(i));
    } else if (failed && !launch_error_) {
      launch_error_ = failed;  // WaitAll raises it; the rest still go out (other ranks wait)
    }
  }
}

std::pair<std::vector<std::string>, std::vector<std::string>> GradReducer::WaitAll(
    const std::function<void(const std::function<void()>&)>& release_gil) {
  std::vector<int> handles;
  std::vector<int> bucket_of;  // per handle: its bucket, -1 for a gradient's own
  std::exception_ptr launch_error;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Param& p : params_) {
      if (p.handle != 0) handles.push_back(std::exchange(p.handle, 0));
    }
    bucket_of.assign(handles.size(), -1);
    for (size_t k = 0; k < buckets_.size(); ++k) {
      if (buckets_[k].handle == 0) continue;
      handles.push_back(std::exchange(buckets_[k].handle, 0));
      bucket_of.push_back(static_cast<int>(k));
    }
    in_flight_ = 0;
    launch_error = std::exchange(launch_error_, nullptr);
    ResetLocked();
  }
  Status first;
  int first_bucket = -1;
  auto wait_all = [&] {
    for (size_t k = 0; k < handles.size(); ++k) {
      std::shared_ptr<TorchPayload> payload;
      Status s = WaitForHandle(*hooks_.handles, handles[k], &payload);
      if (!s.ok() && first.ok()) {
        first = s;
        first_bucket = bucket_of[k];
      }
    }
  };
  if (!handles.empty()) release_gil(wait_all);
  std::vector<std::string> replaced, changed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Param& p : params_) {
      if (!std::exchange(p.sent, false)) continue;
      const at::Tensor& grad = p.tensor.grad();
      if (!grad.defined() || grad.data_ptr() != p.sent_data) {
        replaced.push_back(p.name);
      } else if (static_cast<int64_t>(grad._version()) != p.sent_version) {
        changed.push_back(p.name);
      }
    }
  }
  if (launch_error) std::rethrow_exception(launch_error);
  if (first_bucket >= 0) {
    std::exception_ptr explained;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (static_cast<size_t>(first_bucket) < buckets_.size()) {
        explained = BucketErrorLocked(buckets_[static_cast<size_t>(first_bucket)], first);
      }
    }
    if (explained) std::rethrow_exception(explained);
  }
  ThrowIfError(first);
  return {replaced, changed};
}

void GradReducer::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Param& p : params_) {
    if (p.handle != 0) hooks_.handles->Release(std::exchange(p.handle, 0));
    p.sent = false;
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
