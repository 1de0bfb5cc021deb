// LocalTransportFabric: a Fabric for N ranks that are threads of one process (tests only): process set 0
// over LocalTransports, with the single-copy layer on top when asked (threads share one pid, so
// process_vm_readv reads "the peer's" memory for real). `hosts[i]` names rank i's pretend host:
// single copy pairs ranks of one host, and more than one host makes rings use network segments.
// The ranks share the mailboxes; each thread owns its LocalTransportFabric. Other process sets and
// hierarchical transports are not offered.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/fabric.h"
#include "testing/local_transport.h"

namespace hvdl {

class LocalTransportFabric : public Fabric {
 public:
  LocalTransportFabric(std::shared_ptr<LocalMailboxes> boxes, int rank, std::vector<std::string> hosts,
              bool single_copy);
  Status AddProcessSet(int ps, const std::vector<int>& ranks) override;
  Status RemoveProcessSet(int ps) override { return Status::Ok(); }
  int SetSize(int ps) const override { return ps == 0 ? boxes_->size() : 0; }
  int SetRank(int ps) const override { return ps == 0 ? rank_ : -1; }
  Status SetTransport(int ps, Transport** out) override;
  bool hierarchical() const override { return false; }
  bool spans_hosts() const override;
  bool homogeneous() const override { return true; }
  Status HostTransports(Transport** local, Transport** cross) override;
  Status Meet(int ps) override { return Status::Ok(); }
  int single_copy_transports() const override;
  int single_copy_peers() const override;

 private:
  std::shared_ptr<LocalMailboxes> boxes_;
  int rank_;
  std::vector<std::string> hosts_;
  bool single_copy_;
  std::unique_ptr<Transport> transport_;
};

}  // namespace hvdl
