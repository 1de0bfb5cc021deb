// LocalTransport: point-to-point between rank threads of one process, for ring unit tests.
//
// Sends are buffered (copied into the destination's FIFO for this sender and complete at once);
// a receive completes in Wait when the next message from its peer is there.
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/transport.h"

namespace hvdl {

class LocalMailboxes {
 public:
  explicit LocalMailboxes(int size) : size_(size), queues_(static_cast<size_t>(size * size)) {}
  int size() const { return size_; }

 private:
  friend class LocalTransport;
  std::deque<std::string>& Queue(int src, int dst) {
    return queues_[static_cast<size_t>(src * size_ + dst)];
  }
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::string>> queues_;
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalMailboxes> boxes, int rank) : boxes_(std::move(boxes)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return boxes_->size(); }
  Status Isend(const void* buf, size_t bytes, int peer, int* request) override;
  Status Irecv(void* buf, size_t bytes, int peer, int* request) override;
  Status IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                    int* request) override;
  Status Wait(int request) override;

 private:
  struct PendingRecv {
    std::vector<Span> spans;  // a plain receive is one span of bytes (esize 1)
    size_t esize;
    int peer;
  };
  void Deliver(std::string msg, int peer);
  std::shared_ptr<LocalMailboxes> boxes_;
  int rank_;
  int next_ = 0;
  std::map<int, PendingRecv> recvs_;
};

}  // namespace hvdl
