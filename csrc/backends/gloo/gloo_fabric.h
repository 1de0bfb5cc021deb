// GlooFabric: the Fabric of a launch without MPI - a GlooTransport per process set over the job's
// one Gloo process group (each set's messages on tags of its own), and the host / cross
// transports of hierarchical algorithms over the same group.
//
// Meet is free: a GlooTransport waits on a condition variable, never by spinning, so a rank that
// reaches a collective early costs nothing while it waits for its peers.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/gloo/gloo_work.h"
#include "backends/gloo/gloo_world.h"
#include "comm/fabric.h"

namespace hvdl {

class GlooFabric : public Fabric {
 public:
  // `waits` is not owned and must outlive the fabric.
  GlooFabric(c10::intrusive_ptr<c10d::Backend> backend, const GlooLaunch& launch,
             GlooWaits* waits);

  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override;
  int SetSize(int ps) const override;
  int SetRank(int ps) const override;
  Status SetTransport(int ps, Transport** out) override;
  bool hierarchical() const override;
  bool spans_hosts() const override { return launch_.cross_size > 1; }
  bool homogeneous() const override { return homogeneous_; }
  Status HostTransports(Transport** local, Transport** cross) override;
  Status Meet(int ps) override { return Status::Ok(); }
  int single_copy_transports() const override { return 0; }
  int single_copy_peers() const override { return 0; }

  // Tags: process set ps uses [ps * kTagsPerSet, ...); the host and cross transports the last.
  static constexpr int kTagsPerSet = 8;

 private:
  std::unique_ptr<Transport> Make(const std::vector<int>& members, int tag_base) const;

  c10::intrusive_ptr<c10d::Backend> backend_;
  GlooLaunch launch_;
  GlooWaits* waits_;
  bool homogeneous_;
  std::map<int, std::vector<int>> members_;  // process set -> its ranks, ascending
  std::map<int, std::unique_ptr<Transport>> transports_;
  std::unique_ptr<Transport> local_, cross_;
};

}  // namespace hvdl
