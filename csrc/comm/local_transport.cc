#include "comm/local_transport.h"

#include <cstring>

namespace hvdl {

Status LocalTransport::Isend(const void* buf, size_t bytes, int peer, int* request) {
  {
    std::lock_guard<std::mutex> lock(boxes_->mu_);
    boxes_->Queue(rank_, peer).emplace_back(static_cast<const char*>(buf), bytes);
  }
  boxes_->cv_.notify_all();
  *request = -1;  // buffered: already complete
  return Status::Ok();
}

Status LocalTransport::Irecv(void* buf, size_t bytes, int peer, int* request) {
  *request = next_++;
  recvs_[*request] = PendingRecv{buf, bytes, peer};
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
  if (msg.size() != r.bytes) {
    return Status::Internal("local transport: expected " + std::to_string(r.bytes) +
                            " bytes from " + std::to_string(r.peer) + ", got " +
                            std::to_string(msg.size()));
  }
  std::memcpy(r.buf, msg.data(), msg.size());
  return Status::Ok();
}

}  // namespace hvdl
