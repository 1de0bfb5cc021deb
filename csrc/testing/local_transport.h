// LocalTransport: point-to-point between rank threads of one process, for unit tests of the
// algorithms over Transport (ring, hierarchical, transport collectives, single copy).
//
// Sends are buffered (copied into the destination's FIFO for this sender and tag, and complete
// at once); a receive completes in Wait when the next message from its peer on its tag is there.
// Failed mailboxes (LocalMailboxes::Fail, a test's lost rank) fail every wait that would block,
// as a real transport fails its waits once its job lost a rank; messages already there are
// still received. A receive copies only in Wait, so Wait and Cancel are final.
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
  explicit LocalMailboxes(int size)
      : size_(size), queues_(static_cast<size_t>(size * size * Transport::kTags)) {}
  int size() const { return size_; }
  // Any thread: every later wait that finds no message fails with `why`.
  void Fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_.empty()) failed_ = why;
    }
    cv_.notify_all();
  }

 private:
  friend class LocalTransport;
  std::deque<std::string>& Queue(int src, int dst, int tag) {
    return queues_[static_cast<size_t>((src * size_ + dst) * Transport::kTags + tag)];
  }
  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::string>> queues_;
  std::string failed_;  // non-empty once failed
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalMailboxes> boxes, int rank)
      : boxes_(std::move(boxes)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return boxes_->size(); }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;
  // Releases a posted request without receiving (nothing is ever copied into it).
  void Cancel(int request) { recvs_.erase(request); }
  // Like Gloo's: a send is done at once, a receive is never known to be (routed transports
  // then keep their other parts moving while they wait on it).
  bool Ready(int request) override { return request < 0; }

 private:
  struct PendingRecv {
    std::vector<Span> spans;
    size_t esize;
    int peer;
    int tag;
  };
  std::shared_ptr<LocalMailboxes> boxes_;
  int rank_;
  int next_ = 0;
  std::map<int, PendingRecv> recvs_;
};

}  // namespace hvdl
