// LocalControlPlane: N ranks as threads in one process, for unit tests of the negotiation.
//
// A shared LocalFabric holds one mailbox per collective kind. Each rank thread owns one
// LocalControlPlane; the collectives rendezvous through the fabric's mutex and condition variable,
// so the protocol code under test runs exactly as it would over MPI, minus MPI.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>

#include "comm/control_plane.h"

namespace hvdl {

class LocalFabric {
 public:
  explicit LocalFabric(int size);
  int size() const { return size_; }

 private:
  friend class LocalControlPlane;
  struct Round {
    int arrived = 0;
    int departed = 0;
    std::vector<std::string> slots;
    std::vector<uint64_t> bits;
  };
  // Runs one rendezvous round of kind `kind`: `contribute` runs under the lock on arrival; the
  // last rank to arrive wakes everyone; `collect` runs under the lock once all have arrived.
  template <typename Contribute, typename Collect>
  void Rendezvous(int kind, Contribute contribute, Collect collect);

  int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  Round rounds_[3];
  uint64_t generation_[3] = {0, 0, 0};
};

class LocalControlPlane : public ControlPlane {
 public:
  LocalControlPlane(std::shared_ptr<LocalFabric> fabric, int rank);
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  Status StartBitwiseOr(uint64_t* words, size_t n) override;
  Status TestBitwiseOr(bool* done) override;
  Status Gather(const std::string& send, std::vector<std::string>* recv) override;
  Status Broadcast(std::string* data) override;

 private:
  std::shared_ptr<LocalFabric> fabric_;
  int rank_;
  uint64_t* pending_words_ = nullptr;
  size_t pending_n_ = 0;
};

}  // namespace hvdl
