#include "testing/faulty_transport.h"

namespace hvdl {

Status FaultPlan::Count(int r, bool post) {
  std::lock_guard<std::mutex> lock(mu_);
  if (kind == Kind::kNone || r != rank || triggered_) return Status::Ok();
  if ((kind == Kind::kPost && !post) || (kind == Kind::kWait && post)) return Status::Ok();
  if (calls_++ != at) return Status::Ok();
  triggered_ = true;
  const std::string why = std::string("injected: rank ") + std::to_string(r) + "'s " +
                          (post ? "post" : "wait") + " #" + std::to_string(at) + " failed" +
                          (kind == Kind::kPeer ? " (the rank is lost)" : "");
  for (auto& b : boxes) b->Fail(why);
  return kind == Kind::kPeer ? Status::PeerFailed(why) : Status::Internal(why);
}

bool FaultPlan::lost(int r) {
  std::lock_guard<std::mutex> lock(mu_);
  return kind == Kind::kPeer && triggered_ && r == rank;
}

int FaultPlan::calls() {
  std::lock_guard<std::mutex> lock(mu_);
  return calls_;
}

Status FaultyTransport::Check(bool post, int peer) {
  if (!failed_.ok()) return failed_;
  const int me = globals_[static_cast<size_t>(rank())];
  Status s = plan_->Count(me, post);
  if (s.ok() && plan_->lost(me)) s = Status::PeerFailed("this rank was lost");
  if (!s.ok()) {
    failed_ = s;
    return s;
  }
  const int other = globals_[static_cast<size_t>(peer)];
  if (plan_->lost(other)) return Status::PeerFailed("rank " + std::to_string(other) + " lost");
  return Status::Ok();
}

Status FaultyTransport::Remember(int inner, int peer, int* request) {
  *request = next_++;
  posted_[*request] = Posted{inner, peer};
  return Status::Ok();
}

Status FaultyTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                 int* request) {
  HVDL_RETURN_IF_ERROR(Check(true, peer));
  int inner;
  HVDL_RETURN_IF_ERROR(inner_.PostSend(spans, esize, peer, tag, &inner));
  return Remember(inner, peer, request);
}

Status FaultyTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                 int* request) {
  HVDL_RETURN_IF_ERROR(Check(true, peer));
  int inner;
  HVDL_RETURN_IF_ERROR(inner_.PostRecv(spans, esize, peer, tag, &inner));
  return Remember(inner, peer, request);
}

Status FaultyTransport::Wait(int request) {
  auto it = posted_.find(request);
  if (it == posted_.end()) {
    ++misuse_;
    return Status::Internal("faulty transport: wait on request " + std::to_string(request) +
                            ", which is not posted");
  }
  const Posted p = it->second;
  posted_.erase(it);
  Status s = Check(false, p.peer);
  if (!s.ok()) {
    inner_.Cancel(p.inner);  // final: nothing is received into it
    return s;
  }
  return inner_.Wait(p.inner);
}

}  // namespace hvdl
