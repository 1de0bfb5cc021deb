// HierarchicalControlPlane: the job's ControlPlane composed of one ControlPlane per host and a
// Transport among the hosts' roots, so the negotiation crosses the network once per host, not
// once per rank (e.g. shared memory inside each host, Gloo between hosts).
//
// Who is who. `local` connects the ranks of this host; its member 0 is the host's ROOT (the
// composition root orders local members by global rank, so the root is the host's lowest
// rank). `cross` connects the roots, one member per host; cross member 0 is the root of the
// host that runs global rank 0, and global rank 0 must be that root: it is the root of Gather
// and Broadcast. Non-roots have no cross transport; a one-host job has none at all. The layout
// (each local member's global rank, each root's global rank) is an input, checked by Create.
//
// Bitwise OR (non-blocking for every non-root):
//   1. StartBitwiseOr starts a local round on the caller's words;
//   2. once TestBitwiseOr sees it done (the host's OR), a root exchanges with the other roots
//      over `cross` - each sends its host's words to cross member 0, which ORs them and sends
//      the job's result back - while the non-roots zero their words;
//   3. every member starts a second local round on its words: the root contributes the job's
//      result, the others zeros, so the second round's OR is the job's result everywhere, and
//      non-roots learn it with the same non-blocking test as any round;
//   with one host, step 1 is the whole operation.
//   Step 2 blocks the root in Wait: acceptable, because the other roots run the same cycle
//   (every few ms at most) and reach it promptly, and a root's local members only poll.
// Gather: a local gather to each root; each root sends its host's contributions, tagged with
//   their global ranks and length-prefixed, to cross member 0, which places every rank's in
//   GLOBAL rank order. Broadcast: the reverse - cross member 0 sends the data to every root
//   (length, then bytes), then each host broadcasts locally.
// All cross traffic uses tag `cross_tag` of the transport: the protocol's steps are complete
// exchanges that every root runs in the same order, so messages of different steps never meet.
//
// Contract (ControlPlane's): background thread only; errors of either part come back naming
// the step; nothing throws.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/control_plane.h"
#include "comm/transport.h"

namespace hvdl {

struct HierarchicalLayout {
  int size = 0;                  // ranks in the job
  std::vector<int> local_ranks;  // global rank of each member of the local control plane
  std::vector<int> root_ranks;   // global rank of each host's root, indexed by cross member
  int cross_tag = 0;             // the cross transport's channel for this control plane
};

class HierarchicalControlPlane : public ControlPlane {
 public:
  // Checks the layout against the parts (kInvalidArgument naming what is wrong) and builds
  // the control plane. `cross` only on roots of a job with more than one host; owns both.
  static Status Create(std::unique_ptr<ControlPlane> local, std::unique_ptr<Transport> cross,
                       const HierarchicalLayout& layout,
                       std::unique_ptr<HierarchicalControlPlane>* out);

  int rank() const override { return rank_; }
  int size() const override { return layout_.size; }
  bool root() const { return local_->rank() == 0; }
  int hosts() const { return static_cast<int>(layout_.root_ranks.size()); }

  Status StartBitwiseOr(uint64_t* words, size_t n) override;   // non-blocking
  Status TestBitwiseOr(bool* done) override;                   // blocking on roots in step 2
  Status Gather(const std::string& send, std::vector<std::string>* recv) override;  // blocking
  Status Broadcast(std::string* data) override;                                      // blocking

 private:
  enum class Phase { kIdle, kHost, kJob };
  HierarchicalControlPlane(std::unique_ptr<ControlPlane> local, std::unique_ptr<Transport> cross,
                           const HierarchicalLayout& layout);
  Status CrossOr();
  Status CrossGather(const std::string& blob, std::vector<std::string>* recv);
  Status Place(const std::vector<std::string>& blobs, std::vector<std::string>* recv) const;
  Status Step(const char* what, const Status& s) const;

  std::unique_ptr<ControlPlane> local_;
  std::unique_ptr<Transport> cross_;
  HierarchicalLayout layout_;
  int rank_ = 0;
  Phase phase_ = Phase::kIdle;
  uint64_t* words_ = nullptr;
  size_t n_ = 0;
  std::vector<uint64_t> scratch_;  // cross member 0: the other hosts' words
};

}  // namespace hvdl
