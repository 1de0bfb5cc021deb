#include "backends/shm/shm_transport.h"

#include <algorithm>
#include <cstring>

#include "backends/shm/shm_waiter.h"

namespace hvdl {
namespace {

// Copies `n` bytes between `buf` and the spans of the operation at its cursor, and moves the
// cursor. `to_spans`: scatter (receive), else gather (send).
template <typename OpT>
void CopyAtCursor(OpT* op, char* buf, size_t n, bool to_spans) {
  while (n > 0 || (op->piece < op->spans.size() && op->spans[op->piece].count == op->within)) {
    const Span& s = op->spans[op->piece];
    const size_t take = std::min(n, static_cast<size_t>(s.count - op->within));
    char* there = static_cast<char*>(s.data) + op->within;
    if (take > 0) std::memcpy(to_spans ? there : buf, to_spans ? buf : there, take);
    buf += take;
    n -= take;
    op->within += static_cast<int64_t>(take);
    if (op->within == s.count) {
      ++op->piece;
      op->within = 0;
    }
  }
}

}  // namespace

ShmTransport::ShmTransport(std::shared_ptr<ShmGroup> group)
    : group_(std::move(group)),
      queues_(2 * static_cast<size_t>(group_->size()) * static_cast<size_t>(kTags)) {
  const int me = rank();
  for (int peer = 0; peer < size(); ++peer) {
    for (int tag = 0; tag < group_->tags(); ++tag) {
      if (void* out = group_->Ring(me, peer, tag)) {
        queues_[QueueIndex(true, peer, tag)].ring = ShmRing(out, group_->slots());
      }
      if (void* in = group_->Ring(peer, me, tag)) {
        queues_[QueueIndex(false, peer, tag)].ring = ShmRing(in, group_->slots());
      }
    }
  }
}

size_t ShmTransport::QueueIndex(bool send, int peer, int tag) const {
  const size_t half = static_cast<size_t>(size()) * static_cast<size_t>(kTags);
  return (send ? 0 : half) + static_cast<size_t>(peer) * kTags + static_cast<size_t>(tag);
}

std::string ShmTransport::Describe(const Op& op) const {
  return std::string(op.send ? "send to " : "receive from ") + group_->MemberName(op.peer) +
         " on tag " + std::to_string(op.tag);
}

Status ShmTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                              int* request) {
  return Post(true, spans, esize, peer, tag, request);
}

Status ShmTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                              int* request) {
  return Post(false, spans, esize, peer, tag, request);
}

Status ShmTransport::Post(bool send, const std::vector<Span>& spans, size_t esize, int peer,
                          int tag, int* request) {
  *request = -1;
  if (!failure_.ok()) return failure_;
  if (peer < 0 || peer >= size() || tag < 0 || tag >= kTags ||
      !queues_[QueueIndex(send, peer, tag)].ring.valid()) {
    return Status::InvalidArgument("shm transport of '" + group_->name() + "': no channel " +
                                   (send ? "to member " : "from member ") +
                                   std::to_string(peer) + " on tag " + std::to_string(tag) +
                                   " for member " + std::to_string(rank()));
  }
  if (free_.empty()) {
    free_.push_back(static_cast<int>(ops_.size()));
    ops_.emplace_back();
  }
  *request = free_.back();
  free_.pop_back();
  Op& op = ops_[static_cast<size_t>(*request)];
  op.spans.clear();
  op.room = 0;
  for (const Span& s : spans) {
    const int64_t bytes = s.count * static_cast<int64_t>(esize);
    op.spans.push_back(Span{s.data, bytes});
    op.room += static_cast<uint64_t>(bytes);
  }
  op.total = op.done = 0;
  op.piece = 0;
  op.within = 0;
  op.peer = peer;
  op.tag = tag;
  op.send = send;
  op.started = op.complete = false;
  op.in_use = true;
  op.status = Status::Ok();
  const size_t qi = QueueIndex(send, peer, tag);
  Queue& q = queues_[qi];
  q.ops.push_back(*request);
  // Progress at once when this is the queue's oldest operation (a small send completes here).
  if (q.ops.size() == 1) Advance(qi);
  if (!failure_.ok()) {  // a corrupt stream: nothing to wait for
    op.in_use = false;
    free_.push_back(*request);
    *request = -1;
    return failure_;
  }
  if (!q.ops.empty() && !q.listed) {
    q.listed = true;
    active_.push_back(qi);
  }
  return Status::Ok();
}

bool ShmTransport::Advance(size_t queue) {
  Queue& q = queues_[queue];
  const bool send = queue < queues_.size() / 2;
  return send ? AdvanceSend(&q) : AdvanceRecv(&q);
}

// The oldest send writes fragments while slots are free; then the next one, in posting order.
bool ShmTransport::AdvanceSend(Queue* q) {
  bool moved = false;
  while (!q->ops.empty()) {
    Op& op = ops_[static_cast<size_t>(q->ops.front())];
    while (!op.complete) {
      ShmFragment* f = q->ring.FreeSlot();
      if (f == nullptr) return moved;
      const uint64_t n = std::min<uint64_t>(ShmRing::kSlotPayload, op.room - op.done);
      f->total = op.room;
      f->offset = op.done;
      f->bytes = static_cast<uint32_t>(n);
      CopyAtCursor(&op, ShmRing::Payload(f), n, false);
      q->ring.Publish();
      op.done += n;
      op.complete = op.done == op.room;
      moved = true;
    }
    q->ops.pop_front();
  }
  return moved;
}

// The oldest receive copies arrived fragments into its spans; then the next one. A message
// larger than the receive is consumed without copying and fails the receive.
bool ShmTransport::AdvanceRecv(Queue* q) {
  bool moved = false;
  while (!q->ops.empty()) {
    Op& op = ops_[static_cast<size_t>(q->ops.front())];
    while (!op.complete) {
      const ShmFragment* f = q->ring.Arrived();
      if (f == nullptr) return moved;
      if (!op.started) {
        op.started = true;
        op.total = f->total;
        if (op.total > op.room) {
          op.status = Status::Internal(
              "shm transport of '" + group_->name() + "': a " + std::to_string(op.total) +
              "-byte message from " + group_->MemberName(op.peer) + " on tag " +
              std::to_string(op.tag) + " for a " + std::to_string(op.room) + "-byte receive on " +
              group_->MemberName(rank()) + "; a receive must hold the whole message");
        }
      }
      if (f->offset != op.done || f->total != op.total || f->bytes > ShmRing::kSlotPayload ||
          f->offset + f->bytes > f->total) {
        FailAll(Status::Internal("shm transport of '" + group_->name() + "': corrupt fragment "
                                 "from " + group_->MemberName(op.peer) + " on tag " +
                                 std::to_string(op.tag)));
        return true;
      }
      if (op.status.ok()) CopyAtCursor(&op, const_cast<char*>(ShmRing::Payload(f)), f->bytes, true);
      op.done += f->bytes;
      q->ring.Release();
      op.complete = op.done == op.total;
      moved = true;
    }
    q->ops.pop_front();
  }
  return moved;
}

bool ShmTransport::AdvanceAll() {
  bool moved = false;
  for (size_t i = 0; i < active_.size() && failure_.ok();) {
    Queue& q = queues_[active_[i]];
    moved |= Advance(active_[i]);
    if (!failure_.ok()) return true;  // FailAll emptied every queue
    if (q.ops.empty()) {
      q.listed = false;
      active_[i] = active_.back();
      active_.pop_back();
    } else {
      ++i;
    }
  }
  return moved;
}

// A caller that polls instead of waiting here (comm/routed_transport, while it waits on another
// transport) gets the waits' checks too: the group's cancellation at once, the peers' processes
// every ShmWaiter::kLivenessPeriod.
bool ShmTransport::Progress() {
  AdvanceAll();
  if (!failure_.ok() || active_.empty()) return false;
  Status s = group_->cancelled();
  const auto now = ShmWaiter::Clock::now();
  if (s.ok() && now >= next_liveness_check_) {
    next_liveness_check_ = now + ShmWaiter::kLivenessPeriod;
    s = group_->CheckPeers();
  }
  if (!s.ok()) {
    FailAll(Status(s.code(), "shm transport of '" + group_->name() + "' on " +
                                 group_->MemberName(rank()) + " failed: " + s.message()));
    return false;
  }
  return true;
}

bool ShmTransport::Ready(int request) {
  if (request < 0 || static_cast<size_t>(request) >= ops_.size()) return true;
  const Op& op = ops_[static_cast<size_t>(request)];
  return !op.in_use || op.complete || !failure_.ok();
}

// The transport cannot go on (a member died, the group was cancelled, a stream is corrupt):
// forget every pending operation, so no caller's buffer is touched again.
void ShmTransport::FailAll(const Status& cause) {
  failure_ = cause;
  for (Queue& q : queues_) {
    q.ops.clear();
    q.listed = false;
  }
  active_.clear();
}

Status ShmTransport::Wait(int request) {
  if (request < 0 || static_cast<size_t>(request) >= ops_.size() ||
      !ops_[static_cast<size_t>(request)].in_use) {
    return Status::Internal("shm transport of '" + group_->name() + "': Wait on unknown request " +
                            std::to_string(request));
  }
  Op& op = ops_[static_cast<size_t>(request)];
  ShmWaiter waiter(group_.get(), op.peer);
  while (!op.complete && failure_.ok()) {
    if (AdvanceAll()) {
      waiter.Progressed();
      continue;
    }
    Status s = waiter.Idle();
    if (!s.ok()) {
      FailAll(Status(s.code(), "shm transport: " + Describe(op) + " on " +
                                   group_->MemberName(rank()) + " failed: " + s.message()));
    }
  }
  Status result = op.complete ? op.status : failure_;
  op.in_use = false;
  op.spans.clear();
  free_.push_back(request);
  return result;
}

}  // namespace hvdl
