// GradReducer: DistributedOptimizer's per-gradient path in C++ (docs/architecture.md).
//
// Protocol, per registered parameter and backward pass:
//   1. Autograd runs the parameter's AccumulateGrad node (p.grad now holds this pass's sum), then
//      our post hook on that node (accumulator_hook.h: one per node, shared by every reducer
//      subscribed to it, never removed). The hook is our own, beside whatever the user put on
//      the tensor (torch keeps one post-accumulate-grad slot per tensor, which Python's
//      register_post_accumulate_grad_hook fills); DDP's Reducer hooks gradients the same way.
//   2. The hook counts the pass. On the k-th (backward_passes_per_step) it enqueues the in-place
//      allreduce of p.grad with the name, op, scale factors and process set resolved at
//      registration: no GIL, no Python frame. A gradient that is not dense and contiguous (or
//      sparse before), or on a CUDA device Python has not confirmed (SetDevice), is deferred:
//      Python launches it at synchronize through its general path, which raises what it raises.
//   3. The first launch of a step takes the GIL once, for the user's call site (stall reports
//      name the line that ran backward).
//   4. synchronize: LaunchMissing enqueues what the hooks did not (parameters unused on this rank
//      go out as zeros, partial accumulations as they are) and returns what Python must launch;
//      WaitAll waits for every handle in one call with the GIL released, then resets the
//      counters. Errors are raised after every handle was waited for, the first one winning.
//   5. At those safe points (zero_grad, synchronize), a parameter whose AccumulateGrad node torch
//      replaced (`p.data = p.data.to(another dtype or device)` drops it) is hooked again on its
//      new node; until then it goes out at synchronize.
//
//   6. Buckets (docs/bucket_views.md): once Python sets a layout (SetBuckets, agreed by every
//      rank), each member's p.grad is a view into its bucket's flat tensor, so autograd
//      accumulates straight into the bucket. When every member is ready the bucket goes out as
//      one in-place allreduce: on the host its members' gradients as the spans of one op, under
//      their names, wherever they are - a gradient in a tensor of its own
//      (zero_grad(set_to_none=True), `p.grad = t`) is reduced there, and a bucket whose members
//      all came so releases its flat tensor; on a device the flat tensor, into which such a
//      gradient is copied once (p.grad made the view again). A member that cannot join (sparse
//      gradient, another dtype/device/shape, frozen or removed at synchronize) breaks the
//      bucket for this step: every member goes out alone as above, and the reason is kept for
//      BucketReport. Whole or member by member is one decision of all ranks: a rank that broke
//      a bucket first sends a marker under the bucket's names (bucket_agreement.cc), so a rank
//      that sent it whole and one that could not both raise, naming the parameter, instead of
//      waiting for names the other never sends.
//
// Lifetime: hooks hold the reducer weakly, and neither Detach nor the destructor touches a
// node's hook list (only the subscriber list of our hook), so the reducer may be destroyed
// inside its own hook or on another thread while backward runs.
//
// Threads: hooks run on autograd's threads (the caller's, and one per CUDA device); the rest on
// the user's thread, GIL held. One mutex guards the state, and it is never held while the GIL is
// taken (the Python-facing calls hold the GIL and then take the mutex).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "core/context.h"
#include "core/handle_table.h"
#include "torch/accumulator_hook.h"
#include "torch/submit.h"

namespace hvdl {

// The error DistributedOptimizer raises when a parameter gets more gradients than it accumulates
// (Python's general path raises the same text).
std::string TooManyPassesMessage(const std::string& param_name, int passes);

class GradReducer : public GradReadyListener, public std::enable_shared_from_this<GradReducer> {
 public:
  struct Hooks {
    std::function<Context&()> context;  // the running Context; throws before init
    HandleTable* handles = nullptr;
    // Called without the GIL: takes it and returns the user's file:line ("" when unknown).
    std::function<std::string()> call_site;
    // Called without the GIL with an exception of common/errors.h (or another std::exception):
    // takes the GIL and throws it as the Python exception the binding boundary maps it to, so
    // that backward() raises what the Python path raised. Never returns.
    std::function<void(std::exception_ptr)> raise;
  };

  GradReducer(Hooks hooks, int reduce_op, double prescale, double postscale, int process_set,
              int passes);
  ~GradReducer() override;
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Hooks `param` (a leaf that requires grad) as `param_name` (errors), negotiating as
  // `negotiated` (the op-prefixed name); returns its index.
  int Add(const at::Tensor& param, std::string param_name, std::string negotiated);
  // Unhooks every parameter; later hooks and calls do nothing.
  void Detach();
  // Unhooks parameter `index` (it left the optimizer): it is not launched again; an allreduce of
  // it in flight is still waited for by WaitAll.
  void Remove(int index);
  // The CUDA device Python's placement check accepted: its gradients take the C++ path.
  void SetDevice(int device);
  void SetPasses(int passes);  // and resets the counters
  void ResetCounters();
  // Enqueues every hooked parameter that requires grad and has not gone out; returns the
  // indices Python must launch (deferred ones). An enqueue that fails is raised by WaitAll.
  // Buckets broken this step first agree with the other ranks (bucket_agreement.cc): their
  // markers are waited for here (without the GIL: `release_gil` drops it around the waits).
  std::vector<int> LaunchMissing(
      const std::function<void(const std::function<void()>&)>& release_gil);
  // Waits (without the GIL; `release_gil` drops it around the waits) for every handle, then
  // resets the counters; raises LaunchMissing's error, else the first handle's. Returns the
  // parameters whose p.grad was replaced (another tensor, or `.data` swapped) while their
  // gradient was in flight - the result went into the tensor that was sent, not into p.grad -
  // and those whose p.grad was changed in place meanwhile (a race with the ring).
  std::pair<std::vector<std::string>, std::vector<std::string>> WaitAll(
      const std::function<void(const std::function<void()>&)>& release_gil);
  // Drops this step's handles without waiting (elastic rollback) and resets the counters.
  void Abandon();
  std::vector<int> InFlight() const;  // indices with an allreduce in flight
  int num_in_flight() const;
  bool fired() const;  // a hook counted a pass since the last reset

  // Lays parameters out in buckets: `members[b]` (reducer indices: same dtype and device,
  // dense and contiguous parameters) share one flat tensor, reduced as `negotiated[b]` on a
  // device (under the members' names on the host; `labels[b]`: how errors name the bucket). A member's existing gradient is copied into its
  // view; every member's p.grad becomes the view. Replaces any earlier layout. GIL held.
  void SetBuckets(const std::vector<std::vector<int>>& members,
                  const std::vector<std::string>& negotiated,
                  const std::vector<std::string>& labels);
  void ClearBuckets();  // back to one allreduce per gradient; gradients keep their values
  // Whether a ready bucket goes out at once (Context::SendNow), overlapping the rest of
  // backward, on every host (default), or waits like other new work for HOROVOD_CYCLE_TIME, or
  // for a wait where the host holds work (HOROVOD_BUCKET_SEND_NOW=0).
  void SetSendBucketsNow(bool now) { send_buckets_now_ = now; }
  struct BucketInfo {
    std::string name;          // negotiated name
    int64_t bytes = 0;
    std::vector<int> members;  // reducer indices, in layout order
    bool views = true;         // its gradients live in its flat tensor (false once released)
    int copies = 0;            // gradients copied during the last step
    int own = 0;               // members reduced in tensors of their own during the last step
    int fallback_steps = 0;    // steps in which the bucket went out member by member
    std::string fallback;      // why, the last time ("" when it never fell back)
  };
  std::vector<BucketInfo> BucketReport() const;
  // The order in which parameters became ready (last pass counted) in the last step that had
  // any: what the layout is built from.
  std::vector<int> ReadyOrder() const;
  // What a layout was built for, per active parameter: its index, its tensor's identity,
  // whether it requires grad, its dtype and device. Equal keys: the same layout still fits.
  // Computed without Python objects (microseconds for hundreds of parameters), so the
  // optimizer can check it twice per step.
  std::vector<int64_t> LayoutKey() const;

  // The hook (autograd's threads).
  void OnGradReady(int index) override;
  // Test inspection: how many reducers' parameters the hook on `param`'s node serves (0: no
  // hook of ours there). Never adds a hook.
  static int SubscribersOn(const at::Tensor& param);

 private:
  struct Param;
  struct Bucket;
  enum class Outcome { kLaunched, kDeferred, kFailed };
  // Under mu_: enqueues param `i`'s gradient or defers it; on failure, `*error` is set.
  Outcome LaunchLocked(Param& p, std::exception_ptr* error);
  bool EligibleLocked(const Param& p, const at::Tensor& grad) const;
  void FetchSiteOnce();  // without mu_: the GIL is taken
  void ResetLocked();
  void RehookLocked();  // parameters whose AccumulateGrad node torch replaced
  void SubscribeLocked(Param& p, int index);
  void UnsubscribeLocked(Param& p);
  // Buckets (under mu_). Adopt: p.grad is the view, or is reduced where it is (host), or
  // becomes the view by one copy; false (and `*reason`) when it cannot. Ready: counts member `index` ready, launching the bucket when
  // full. Break: this step the bucket's members go out one by one.
  bool AdoptLocked(Param& p, Bucket& b, std::string* reason);
  void MoveIntoViewsLocked(Bucket& b);  // members in tensors of their own: copied into views
  void ReadyLocked(int index, std::exception_ptr* error);
  // `position`: the member (in b.members) that cannot join.
  void BreakLocked(Bucket& b, int position, const std::string& reason);
  void LaunchBucketLocked(Bucket& b, std::exception_ptr* error);
  void LaunchMissingBucketsLocked();
  // Per-gradient launches at synchronize of what has not gone out: parameters outside buckets
  // (`broken` false) or the members of broken buckets whose markers the ranks agreed on (true).
  void LaunchAloneLocked(bool broken, std::vector<int>* deferred);
  // bucket_agreement.cc. Submits a broken bucket's markers; the names it would have gone out
  // under, with no elements.
  void SubmitMarkersLocked(Bucket& b);
  // What a failed bucket allreduce or marker raises: `status`, explained when the ranks
  // disagreed on sending the bucket whole (which parameter, which ranks, why here).
  std::exception_ptr BucketErrorLocked(const Bucket& b, const Status& status) const;
  // Whether a bucket that goes out whole does so under its own name (a device bucket, or two
  // ranks or fewer), else under its members' names; LaunchBucketLocked and the markers agree.
  bool UnderItsNameLocked(const Bucket& b) const;

  Hooks hooks_;
  OpSpec spec_;
  mutable std::mutex mu_;
  std::vector<Param> params_;
  std::vector<Bucket> buckets_;
  std::vector<int> order_;       // this step's ready order
  std::vector<int> last_order_;  // the last step's
  int passes_;
  int device_ = -1;
  int in_flight_ = 0;
  bool fired_ = false;
  bool detached_ = false;
  std::atomic<bool> send_buckets_now_{true};
  std::exception_ptr launch_error_;  // LaunchMissing's first failure, for WaitAll
  std::atomic<bool> site_fetched_{false};
  std::string site_;
};

}  // namespace hvdl
