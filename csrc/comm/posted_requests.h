// PostedRequests: the requests an algorithm over a Transport has posted and not yet waited for.
//
// The rule it keeps (transport.h): nothing an algorithm posted is outstanding when it returns, on
// success or on error. A request left behind is a write into memory that is gone - the buffers
// are often the algorithm's locals (a length, a scratch vector) or the caller's tensors, which
// the user frees once the operation has failed - and a request the transport holds forever.
// Every post goes through Send/Recv (or Track after a post made by hand); Wait and WaitAll
// release. Whatever is still posted when the object goes away - an early return on an error -
// is waited for by the destructor, in posting order (the order the transport's contract asks
// for receives from one peer), its status dropped: the error being returned already says what
// went wrong, and Transport::Wait is final on every path, so afterwards the buffers are free.
// Declare it AFTER the buffers its requests use, so that it is destroyed (and drains) first.
// Draining is bounded: a failed transport fails its waits at once; a live peer either matches
// what was posted or is lost (its transport's timeout or a cancel ends the wait); and a
// transport without a timeout (MPI) gives up at the drain's deadline, drain_bound() from its
// start (Transport::WaitUntil).
// Not thread-safe, like every transport: the thread that runs the algorithm.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <iterator>
#include <vector>

#include "comm/transport.h"

namespace hvdl {

class PostedRequests {
 public:
  explicit PostedRequests(Transport* t) : t_(t) {}
  ~PostedRequests() { Drain(); }
  PostedRequests(const PostedRequests&) = delete;
  PostedRequests& operator=(const PostedRequests&) = delete;

  // Transport::PostSend / PostRecv, remembering the request on success (a failed post leaves
  // nothing posted); `request` may be null when only WaitAll/the destructor will wait for it.
  Status Send(const std::vector<Span>& spans, size_t esize, int peer, int tag,
              int* request = nullptr) {
    int r;
    HVDL_RETURN_IF_ERROR(t_->PostSend(spans, esize, peer, tag, &r));
    return Remember(r, request);
  }
  Status Recv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
              int* request = nullptr) {
    int r;
    HVDL_RETURN_IF_ERROR(t_->PostRecv(spans, esize, peer, tag, &r));
    return Remember(r, request);
  }
  // Tag 0, one contiguous buffer.
  Status Send(const void* buf, size_t bytes, int peer, int* request = nullptr) {
    return Send({Span{const_cast<void*>(buf), static_cast<int64_t>(bytes)}}, 1, peer, 0, request);
  }
  Status Recv(void* buf, size_t bytes, int peer, int* request = nullptr) {
    return Recv({Span{buf, static_cast<int64_t>(bytes)}}, 1, peer, 0, request);
  }

  // Waits for one posted request and forgets it.
  Status Wait(int request) {
    // From the back: the request waited for is nearly always among the last posted (a ring
    // step's receive, behind the earlier steps' sends), so this stays O(1) for long rings.
    auto it = std::find(posted_.rbegin(), posted_.rend(), request);
    if (it != posted_.rend()) posted_.erase(std::next(it).base());
    return t_->Wait(request);
  }
  // Waits for every posted request, in posting order, even after one failed; the first error.
  Status WaitAll() {
    Status first;
    std::vector<int> all;
    all.swap(posted_);
    for (int r : all) {
      Status s = t_->Wait(r);
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }
  // The destructor's work: what is still posted after an early return, each request waited
  // for until one deadline at most.
  void Drain() {
    if (posted_.empty()) return;
    const auto deadline = std::chrono::steady_clock::now() + drain_bound();
    std::vector<int> all;
    all.swap(posted_);
    for (int r : all) (void)t_->WaitUntil(r, deadline);
  }
  size_t outstanding() const { return posted_.size(); }

  // How long a drain waits in all (30 s; tests shorten it). Process-wide.
  static std::chrono::milliseconds drain_bound() {
    return std::chrono::milliseconds(drain_bound_ms().load(std::memory_order_relaxed));
  }
  static void set_drain_bound(std::chrono::milliseconds bound) {
    drain_bound_ms().store(bound.count(), std::memory_order_relaxed);
  }

 private:
  Status Remember(int r, int* request) {
    posted_.push_back(r);
    if (request != nullptr) *request = r;
    return Status::Ok();
  }

  static std::atomic<int64_t>& drain_bound_ms() {
    static std::atomic<int64_t> ms{30000};
    return ms;
  }

  Transport* t_;
  std::vector<int> posted_;
};

}  // namespace hvdl
