// Transport: non-blocking point-to-point byte transfer between the members of one group.
//
// Every algorithm above it (comm/ring, comm/hierarchical, comm/transport_collectives) depends on
// this interface only, so MPI point-to-point (backends/mpi/mpi_transport), single copy inside a
// host (comm/single_copy_transport, a layer over any transport) and the in-process test transport
// (testing/local_transport) share one implementation of every algorithm. A transport moves bytes
// and decides nothing.
//
// Contract: background thread only (not thread-safe). Buffers stay owned by the caller and must
// stay valid until Wait returns. Failures return a Status naming the call and the peer; nothing
// throws.
//
// The rule every algorithm over a Transport keeps: nothing it posted is outstanding when it
// returns, on success or on error. It waits for every request it posted, also after one of its
// posts or waits failed (comm/posted_requests.h does it on every early return); a request left
// behind lets a late message land in memory that is gone. What makes that enough, every
// transport guarantees:
//   - a post that fails leaves nothing posted (parts of it already under way are waited for);
//   - Wait is final, whatever it returns: afterwards the transport never touches the request's
//     buffers and the request is released. A transport whose waits can give up early makes the
//     give-up final itself (Gloo: a cancel closes the group's connections, so no message lands
//     after it; gloo_work.h);
//   - Wait ends: once the transport has failed (a peer lost, a cancel, a timeout) its waits
//     fail at once, and a wait on a live peer is bounded by the transport's timeout. A
//     transport without a timeout of its own (MPI) bounds the cleanup instead: WaitUntil, which
//     the cleanup after an error uses, gives up at a deadline (mpi_transport.cc says how).
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "common/status.h"
#include "common/tensor_ref.h"

namespace hvdl {

class Transport {
 public:
  // Channels: messages on different tags never match each other.
  static constexpr int kTags = 4;

  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Posts the send to (receive from) member `peer` of ONE message made of `spans` of
  // `esize`-byte elements, in order, on channel `tag` (0 <= tag < kTags); `*request` identifies
  // it for Wait. The peer may describe the message by other spans of the same total size (a
  // fused batch travels without being packed). Messages between one pair on one tag are
  // received in the order they were sent. A receive may be larger than the message it matches
  // (single copy's descriptors are): the rest of its spans is left as it was.
  virtual Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                          int* request) = 0;
  virtual Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                          int* request) = 0;
  // Blocks until the request completed or failed, and releases it; final either way (above).
  // Receives from one peer on one tag are waited for in the order they were posted.
  virtual Status Wait(int request) = 0;
  // Wait for the cleanup after an error (PostedRequests' drain): a peer that failed elsewhere
  // may never match what was posted to it, so this gives up at `deadline` where the transport
  // can. Final like Wait. The default is Wait, for transports whose waits are bounded anyway
  // (shared memory, Gloo, the test transports).
  virtual Status WaitUntil(int request, std::chrono::steady_clock::time_point deadline) {
    (void)deadline;
    return Wait(request);
  }
  // Members whose messages travel by single copy (read straight from their memory).
  virtual int single_copy_peers() const { return 0; }

  // For transports that move bytes only while their caller waits (shared memory: a message
  // larger than its ring streams through it in Wait): moves what it can of every posted request
  // without blocking; true while some is unfinished. A transport that makes progress on its own
  // (MPI, Gloo's threads) has nothing to do here. A transport joining several
  // (comm/routed_transport) calls it on the others while one part's Wait would block, until
  // they are done: so an algorithm must not wait on one peer while it has posted an operation
  // with another whose match depends on something it posts only after that wait (the ring,
  // the tree broadcast and alltoall do not).
  virtual bool Progress() { return false; }
  // Non-blocking: true when Wait(request) returns without waiting for a peer (done, or failed).
  // The default, true, is for transports whose Wait makes all the progress its requests need.
  virtual bool Ready(int request) { return true; }

  // Tag 0, the channel every algorithm uses.
  Status IsendSpans(const std::vector<Span>& spans, size_t esize, int peer, int* request) {
    return PostSend(spans, esize, peer, 0, request);
  }
  Status IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer, int* request) {
    return PostRecv(spans, esize, peer, 0, request);
  }
  Status Isend(const void* buf, size_t bytes, int peer, int* request) {
    return PostSend({Span{const_cast<void*>(buf), static_cast<int64_t>(bytes)}}, 1, peer, 0,
                    request);
  }
  Status Irecv(void* buf, size_t bytes, int peer, int* request) {
    return PostRecv({Span{buf, static_cast<int64_t>(bytes)}}, 1, peer, 0, request);
  }
};

}  // namespace hvdl
