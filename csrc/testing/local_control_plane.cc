#include "testing/local_control_plane.h"

namespace hvdl {

LocalFabric::LocalFabric(int size) : size_(size) {}

template <typename Contribute, typename Collect>
void LocalFabric::Rendezvous(int kind, Contribute contribute, Collect collect) {
  std::unique_lock<std::mutex> lock(mu_);
  Round& r = rounds_[kind];
  // Wait until the previous round of this kind has fully drained.
  cv_.wait(lock, [&] { return r.departed == 0 || r.departed == size_; });
  if (r.departed == size_) r = Round();
  uint64_t gen = generation_[kind];
  contribute(r);
  if (++r.arrived == size_) {
    ++generation_[kind];
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_[kind] != gen; });
  }
  collect(r);
  if (++r.departed == size_) cv_.notify_all();
}

LocalControlPlane::LocalControlPlane(std::shared_ptr<LocalFabric> fabric, int rank)
    : fabric_(std::move(fabric)), rank_(rank) {}

// The local "non-blocking" OR completes inside TestBitwiseOr: a rank that tests simply waits for
// the others, which is fine for tests (every rank thread keeps cycling).
Status LocalControlPlane::StartBitwiseOr(uint64_t* words, size_t n) {
  pending_words_ = words;
  pending_n_ = n;
  return Status::Ok();
}

Status LocalControlPlane::TestBitwiseOr(bool* done) {
  fabric_->Rendezvous(
      0,
      [&](LocalFabric::Round& r) {
        if (r.bits.size() < pending_n_) r.bits.resize(pending_n_, 0);
        for (size_t i = 0; i < pending_n_; ++i) r.bits[i] |= pending_words_[i];
      },
      [&](LocalFabric::Round& r) {
        for (size_t i = 0; i < pending_n_; ++i) pending_words_[i] = r.bits[i];
      });
  *done = true;
  return Status::Ok();
}

Status LocalControlPlane::Gather(const std::string& send, std::vector<std::string>* recv) {
  fabric_->Rendezvous(
      1,
      [&](LocalFabric::Round& r) {
        r.slots.resize(static_cast<size_t>(size()));
        r.slots[static_cast<size_t>(rank_)] = send;
      },
      [&](LocalFabric::Round& r) {
        if (rank_ == 0) *recv = r.slots;
      });
  return Status::Ok();
}

Status LocalControlPlane::Broadcast(std::string* data) {
  fabric_->Rendezvous(
      2,
      [&](LocalFabric::Round& r) {
        r.slots.resize(1);
        if (rank_ == 0) r.slots[0] = *data;
      },
      [&](LocalFabric::Round& r) {
        if (rank_ != 0) *data = r.slots[0];
      });
  return Status::Ok();
}

}  // namespace hvdl
