#include "testing/local_transport.h"

#include <algorithm>
#include <cstring>

namespace hvdl {

Status LocalTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                int* request) {
  std::string msg;
  for (const Span& s : spans) {
    msg.append(static_cast<const char*>(s.data), static_cast<size_t>(s.count) * esize);
  }
  {
    std::lock_guard<std::mutex> lock(boxes_->mu_);
    boxes_->Queue(rank_, peer, tag).push_back(std::move(msg));
  }
  boxes_->cv_.notify_all();
  *request = -1;  // buffered: already complete
  return Status::Ok();
}

Status LocalTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                int* request) {
  *request = next_++;
  recvs_[*request] = PendingRecv{spans, esize, peer, tag};
  return Status::Ok();
}

Status LocalTransport::Wait(int request) {
  if (request < 0) return Status::Ok();
  auto it = recvs_.find(request);
  if (it == recvs_.end()) return Status::Internal("local transport: unknown request");
  PendingRecv r = it->second;
  recvs_.erase(it);
  std::unique_lock<std::mutex> lock(boxes_->mu_);
  auto& q = boxes_->Queue(r.peer, rank_, r.tag);
  boxes_->cv_.wait(lock, [&] { return !q.empty() || !boxes_->failed_.empty(); });
  if (q.empty()) {
    return Status::PeerFailed("local transport: receive from " + std::to_string(r.peer) +
                              " failed: " + boxes_->failed_);
  }
  std::string msg = std::move(q.front());
  q.pop_front();
  size_t room = 0;
  for (const Span& s : r.spans) room += static_cast<size_t>(s.count) * r.esize;
  if (msg.size() > room) {
    return Status::Internal("local transport: a " + std::to_string(msg.size()) +
                            "-byte message from " + std::to_string(r.peer) + " for a " +
                            std::to_string(room) + "-byte receive");
  }
  size_t off = 0;
  for (const Span& s : r.spans) {
    const size_t n = std::min(static_cast<size_t>(s.count) * r.esize, msg.size() - off);
    std::memcpy(s.data, msg.data() + off, n);
    off += n;
  }
  return Status::Ok();
}

}  // namespace hvdl
