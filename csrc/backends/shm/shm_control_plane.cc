#include "backends/shm/shm_control_plane.h"

#include <cstring>

#include "backends/shm/shm_waiter.h"
#include "comm/posted_requests.h"

namespace hvdl {
namespace {

constexpr int kGatherTag = 0;
constexpr int kBroadcastTag = 1;

}  // namespace

ShmGroupOptions ShmControlPlane::GroupOptions(size_t max_words) {
  ShmGroupOptions o;
  o.tags = 2;
  o.star = true;
  o.slots = 4;
  o.bitwise_or_words = max_words;
  return o;
}

ShmControlPlane::ShmControlPlane(std::shared_ptr<ShmGroup> group)
    : group_(std::move(group)), transport_(group_) {}

Status ShmControlPlane::StartBitwiseOr(uint64_t* words, size_t n) {
  HVDL_RETURN_IF_ERROR(group_->cancelled());
  if (pending_) return Status::Internal("shm control plane: a bitwise OR is already outstanding");
  if (n > group_->bitwise_or_words()) {
    return Status::InvalidArgument(
        "shm control plane of '" + group_->name() + "': a bitwise OR of " + std::to_string(n) +
        " words; the segment holds " + std::to_string(group_->bitwise_or_words()) +
        " per round (size it from the response cache capacity)");
  }
  const int me = rank();
  const uint64_t k = ++round_;
  const int parity = static_cast<int>(k & 1);
  if (n > 0) std::memcpy(group_->OrWords(me, parity), words, n * sizeof(uint64_t));
  *group_->OrCount(me, parity) = n;
  ShmStoreRelease(group_->OrRound(me), k);  // publishes the words and the count
  words_ = words;
  n_ = n;
  pending_ = true;
  next_check_ = Clock::now() + ShmWaiter::kLivenessPeriod;
  return Status::Ok();
}

// The members whose counter has not reached this round.
std::vector<int> ShmControlPlane::Missing() const {
  std::vector<int> out;
  for (int m = 0; m < size(); ++m) {
    if (ShmLoadAcquire(group_->OrRound(m)) < round_) out.push_back(m);
  }
  return out;
}

Status ShmControlPlane::TestBitwiseOr(bool* done) {
  *done = false;
  if (!pending_) return Status::Internal("shm control plane: no bitwise OR outstanding");
  HVDL_RETURN_IF_ERROR(group_->cancelled());
  const int me = rank();
  for (int m = 0; m < size(); ++m) {
    if (ShmLoadAcquire(group_->OrRound(m)) >= round_) continue;
    const auto now = Clock::now();
    if (now >= next_check_) {
      next_check_ = now + ShmWaiter::kLivenessPeriod;
      const std::vector<int> missing = Missing();
      Status s = group_->CheckPeers(missing);
      if (!s.ok()) {
        std::string names;
        for (int w : missing) names += (names.empty() ? "" : ", ") + group_->MemberName(w);
        return Status(s.code(), "shm control plane: bitwise OR round " + std::to_string(round_) +
                                    " waits for " + names + ": " + s.message());
      }
    }
    return Status::Ok();
  }
  // Every member published round k: OR their words (this member's are already in words_).
  const int parity = static_cast<int>(round_ & 1);
  for (int m = 0; m < size(); ++m) {
    if (m == me) continue;
    const uint64_t count = *group_->OrCount(m, parity);
    if (count != n_) {
      pending_ = false;
      return Status::Mismatch("shm control plane: bitwise OR round " + std::to_string(round_) +
                              ": " + group_->MemberName(me) + " passed " + std::to_string(n_) +
                              " words, " + group_->MemberName(m) + " " + std::to_string(count) +
                              "; every rank must pass the same number");
    }
    const uint64_t* theirs = group_->OrWords(m, parity);
    for (size_t i = 0; i < n_; ++i) words_[i] |= theirs[i];
  }
  pending_ = false;
  *done = true;
  return Status::Ok();
}

// Gather and Broadcast wait for every request they posted on every path (comm/transport.h):
// `posted` is declared after the locals the receives land in, so it drains before they go.
Status ShmControlPlane::Gather(const std::string& send, std::vector<std::string>* recv) {
  recv->clear();
  uint64_t length = send.size();
  const size_t n = static_cast<size_t>(size());
  std::vector<uint64_t> lengths(n, 0);
  PostedRequests posted(&transport_);
  if (rank() != 0) {
    HVDL_RETURN_IF_ERROR(posted.Send({Span{&length, sizeof(length)}}, 1, 0, kGatherTag));
    HVDL_RETURN_IF_ERROR(posted.Send({Span{const_cast<char*>(send.data()),
                                           static_cast<int64_t>(send.size())}},
                                     1, 0, kGatherTag));
    return posted.WaitAll();
  }
  // Root: every length first, then every payload into a string of that size.
  for (int m = 1; m < size(); ++m) {
    HVDL_RETURN_IF_ERROR(
        posted.Recv({Span{&lengths[static_cast<size_t>(m)], 8}}, 1, m, kGatherTag));
  }
  HVDL_RETURN_IF_ERROR(posted.WaitAll());
  recv->assign(n, std::string());
  (*recv)[0] = send;
  Status s;
  for (int m = 1; m < size() && s.ok(); ++m) {
    std::string& r = (*recv)[static_cast<size_t>(m)];
    r.resize(lengths[static_cast<size_t>(m)]);
    s = posted.Recv({Span{r.data(), static_cast<int64_t>(r.size())}}, 1, m, kGatherTag);
  }
  const Status waited = posted.WaitAll();  // before recv's strings may go
  if (s.ok()) s = waited;
  if (!s.ok()) recv->clear();
  return s;
}

Status ShmControlPlane::Broadcast(std::string* data) {
  uint64_t length = data->size();
  PostedRequests posted(&transport_);
  if (rank() == 0) {
    for (int m = 1; m < size(); ++m) {
      HVDL_RETURN_IF_ERROR(posted.Send({Span{&length, sizeof(length)}}, 1, m, kBroadcastTag));
      HVDL_RETURN_IF_ERROR(posted.Send({Span{data->data(), static_cast<int64_t>(data->size())}},
                                       1, m, kBroadcastTag));
    }
    return posted.WaitAll();
  }
  HVDL_RETURN_IF_ERROR(posted.Recv({Span{&length, sizeof(length)}}, 1, 0, kBroadcastTag));
  HVDL_RETURN_IF_ERROR(posted.WaitAll());
  data->resize(length);
  HVDL_RETURN_IF_ERROR(
      posted.Recv({Span{data->data(), static_cast<int64_t>(length)}}, 1, 0, kBroadcastTag));
  return posted.WaitAll();
}

}  // namespace hvdl
