// GlooControlPlane: the negotiation's ControlPlane over a c10d backend's collectives (torch's Gloo
// process group), among all ranks of the job.
//
//   StartBitwiseOr   an allreduce(BOR) of int64 words, posted (the group's threads run it);
//   TestBitwiseOr    Work::isCompleted, then the words are copied back;
//   Gather           an allgather of each rank's length, then a gather to rank 0 of every
//                    contribution padded to the longest (c10d gathers equal sizes only);
//   Broadcast        the length from rank 0, then the bytes.
// Every wait gives up after the launch's timeout naming the operation (gloo_work.h). Background
// thread only.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <ATen/ATen.h>

#include "backends/gloo/gloo_work.h"
#include "comm/control_plane.h"

namespace hvdl {

class GlooControlPlane : public ControlPlane {
 public:
  GlooControlPlane(c10::intrusive_ptr<c10d::Backend> backend, GlooWaits* waits);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status StartBitwiseOr(uint64_t* words, size_t n) override;
  Status TestBitwiseOr(bool* done) override;
  Status Gather(const std::string& send, std::vector<std::string>* recv) override;
  Status Broadcast(std::string* data) override;

 private:
  Status Run(const c10::intrusive_ptr<c10d::Work>& work, const char* what);

  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_;
  int size_;
  GlooWaits* waits_;
  c10::intrusive_ptr<c10d::Work> pending_;
  at::Tensor words_tensor_;
  uint64_t* words_ = nullptr;
  size_t n_ = 0;
};

}  // namespace hvdl
