// GlooFabric: the Fabric of a launch without MPI. A process set's transport reaches the members
// on this host through a local transport of its own (LocalParts: shared memory, single copy of
// large messages on top) and the members elsewhere through the job's Gloo process group (each
// set's messages on tags of its own); comm/routed_transport joins the two. The host and cross
// transports of hierarchical algorithms are the same two kinds.
//
// Meet is free: neither kind spins for long (Gloo waits on a condition variable, shared memory
// yields and sleeps), so a rank that reaches a collective early costs little while it waits.
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
  // `waits` is not owned and must outlive the fabric; `local` makes the transports among the
  // ranks of this host.
  GlooFabric(c10::intrusive_ptr<c10d::Backend> backend, const GlooLaunch& launch,
             GlooWaits* waits, LocalParts local);

  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override;
  int SetSize(int ps) const override;
  int SetRank(int ps) const override;
  Status SetTransport(int ps, Transport** out) override;
  bool hierarchical() const override;
  bool spans_hosts() const override { return launch_.cross_size > 1; }
  bool homogeneous() const override { return homogeneous_; }
  // Every Gloo message is a rendezvous (the receiver's notice, then the data) handled by Gloo's
  // loop thread: at 64 KiB, 2 x 2 test hosts spent 1.5-5 s of loop-thread CPU per rank on ten
  // 64 MiB allreduces and took 632-1566 ms each; at 1 MiB 0.17 s and 580-593 ms (4 MiB: 586-612).
  size_t network_segment_bytes() const override { return 1 << 20; }
  Status HostTransports(Transport** local, Transport** cross) override;
  std::vector<std::vector<int>> LocalRankColumns() const override;
  Status Meet(int ps) override { return Status::Ok(); }
  int single_copy_transports() const override;
  int single_copy_peers() const override;

  // Gloo tags: process set ps uses [(ps + 2) * kTagsPerSet, ...); the cross transport of
  // hierarchical algorithms [kTagsPerSet, ...); the control plane's roots [0, ...).
  static constexpr int kTagsPerSet = 8;

  // A Gloo transport among `members` (job ranks, ascending) on tags from `tag_base`.
  std::unique_ptr<Transport> Gloo(const std::vector<int>& members, int tag_base) const;

 private:
  Status Make(const std::vector<int>& members, const std::string& what, int tag_base,
              std::unique_ptr<Transport>* out) const;
  std::string Name(int rank) const;
  bool Here(int rank) const;

  c10::intrusive_ptr<c10d::Backend> backend_;
  GlooLaunch launch_;
  GlooWaits* waits_;
  LocalParts local_parts_;
  bool homogeneous_;
  std::map<int, std::vector<int>> members_;  // process set -> its ranks, ascending
  std::map<int, std::unique_ptr<Transport>> transports_;
  std::unique_ptr<Transport> local_, cross_;
};

}  // namespace hvdl
