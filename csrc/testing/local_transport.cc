#include "testing/local_transport.h"

#include <cstring>

namespace hvdl {

void LocalTransport::Deliver(std::string msg, int peer) {
  {
    std::lock_guard<std::mutex> lock(boxes_->mu_);
    boxes_->Queue(rank_, peer).push_back(std::move(msg));
  }
  boxes_->cv_.notify_all();
}

Status LocalTransport::Isend(const void* buf, size_t bytes, int peer, int* request) {
  Deliver(std::string(static_cast<const char*>(buf), bytes), peer);
  *request = -1;  // buffered: already complete
  return Status::Ok();
}

Status LocalTransport::IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                  int* request) {
  std::string msg;
  for (const Span& s : spans) {
    msg.append(static_cast<const char*>(s.data), static_cast<size_t>(s.count) * esize);
  }
  Deliver(std::move(msg), peer);
  *request = -1;
  return Status::Ok();
}

Status LocalTransport::Irecv(void* buf, size_t bytes, int peer, int* request) {
  *request = next_++;
  recvs_[*request] = PendingRecv{{Span{buf, static_cast<int64_t>(bytes)}}, 1, peer};
  return Status::Ok();
}

Status LocalTransport::IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                  int* request) {
  *request = next_++;
  recvs_[*request] = PendingRecv{spans, esize, peer};
  return Status::Ok();
}

Status LocalTransport::Wait(int request) {
  if (request < 0) return Status::Ok();
  auto it = recvs_.find(request);
  if (it == recvs_.end()) return Status::Internal("local transport: unknown request");
  PendingRecv r = it->second;
  recvs_.erase(it);
  std::unique_lock<std::mutex> lock(boxes_->mu_);
  auto& q = boxes_->Queue(r.peer, rank_);
  boxes_->cv_.wait(lock, [&] { return !q.empty(); });
  std::string msg = std::move(q.front());
  q.pop_front();
  size_t expected = 0;
  for (const Span& s : r.spans) expected += static_cast<size_t>(s.count) * r.esize;
  if (msg.size() != expected) {
    return Status::Internal("local transport: expected " + std::to_string(expected) +
                            " bytes from " + std::to_string(r.peer) + ", got " +
                            std::to_string(msg.size()));
  }
  size_t off = 0;
  for (const Span& s : r.spans) {
    const size_t n = static_cast<size_t>(s.count) * r.esize;
    std::memcpy(s.data, msg.data() + off, n);
    off += n;
  }
  return Status::Ok();
}

}  // namespace hvdl
