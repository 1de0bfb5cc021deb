// Fabric: the transports of a launch, per process set, and what the algorithms need to know
// about where the ranks run.
//
// The composition root builds one per launch from a transport family (backends/mpi/mpi_fabric
// over MPI point-to-point, with single copy inside a host); the host collectives
// (comm/host_collectives) run every algorithm over what it hands out. Process sets are
// set-relative: member i of set `ps` is its i-th rank in ascending global order.
//
// Contract: background thread only, except the constructor (main thread, collective over the
// job). Methods marked collective are reached by every member in the same agreed order (the
// executor runs the agreed responses in one order everywhere). Failures return a Status.
#pragma once

#include <cstddef>
#include <vector>

#include "comm/transport.h"
#include "common/status.h"

namespace hvdl {

class Fabric {
 public:
  virtual ~Fabric() = default;

  // Collective over every rank of the job: creates / destroys what process set `ps` needs.
  // Non-members take part but get nothing.
  virtual Status AddProcessSet(int ps, const std::vector<int>& ranks) = 0;
  virtual Status RemoveProcessSet(int ps) = 0;
  // Members of `ps` (0 where this rank is not one), and this rank's index among them (-1).
  virtual int SetSize(int ps) const = 0;
  virtual int SetRank(int ps) const = 0;

  // The transport among the members of `ps`. Built at first use, collectively over the members.
  virtual Status SetTransport(int ps, Transport** out) = 0;
  // The job (set 0) spans several hosts with the same number of ranks on each, more than one:
  // the layout hierarchical algorithms need.
  virtual bool hierarchical() const = 0;
  // The job runs on more than one host (links between them are network links).
  virtual bool spans_hosts() const = 0;
  // Every host of the job runs the same number of ranks (one host included).
  virtual bool homogeneous() const = 0;
  // The ring segment on links between hosts, unless HOROVOD_RING_SEGMENT_BYTES says otherwise:
  // what this fabric's network transport moves best per message (MPI over TCP: its eager size).
  virtual size_t network_segment_bytes() const { return 64 * 1024; }
  // For set 0, when homogeneous(): the transport among this host's ranks (`local`, member i =
  // local rank i) and among the ranks with this rank's local rank, one per host (`cross`, its
  // members in ascending rank order - host order where hosts hold contiguous ranks). Built at
  // first use, collectively over the job.
  virtual Status HostTransports(Transport** local, Transport** cross) = 0;
  // When hierarchical(): columns[l] = the job's ranks with local rank l, ascending - the members
  // of the cross transport of local rank l, in its member order. Empty where the fabric offers
  // no hierarchical gathers (its natives have their own).
  virtual std::vector<std::vector<int>> LocalRankColumns() const { return {}; }

  // Blocking: every member of `ps` has reached this call. Waits without spinning, so that a
  // rank that gets to a collective before its peers does not burn a core the training threads
  // need while the collective's own waits (which may spin) have not started.
  virtual Status Meet(int ps) = 0;

  // Transports built so far that read some member's memory directly, and the members they read.
  virtual int single_copy_transports() const = 0;
  virtual int single_copy_peers() const = 0;
};

}  // namespace hvdl
