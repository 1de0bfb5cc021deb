#include "testing/local_transport_fabric.h"

#include "comm/single_copy_transport.h"

namespace hvdl {

LocalTransportFabric::LocalTransportFabric(std::shared_ptr<LocalMailboxes> boxes, int rank,
                         std::vector<std::string> hosts, bool single_copy)
    : boxes_(std::move(boxes)), rank_(rank), hosts_(std::move(hosts)), single_copy_(single_copy) {
  hosts_.resize(static_cast<size_t>(boxes_->size()), "host");
}

Status LocalTransportFabric::AddProcessSet(int ps, const std::vector<int>& ranks) {
  return Status::Internal("the local test fabric offers process set 0 only");
}

bool LocalTransportFabric::spans_hosts() const {
  for (const std::string& h : hosts_) {
    if (h != hosts_.front()) return true;
  }
  return false;
}

Status LocalTransportFabric::SetTransport(int ps, Transport** out) {
  if (ps != 0) return Status::Internal("the local test fabric offers process set 0 only");
  if (!transport_) {
    auto base = std::make_unique<LocalTransport>(boxes_, rank_);
    if (single_copy_) {
      transport_ = std::make_unique<SingleCopyTransport>(std::move(base), hosts_);
    } else {
      transport_ = std::move(base);
    }
  }
  *out = transport_.get();
  return Status::Ok();
}

Status LocalTransportFabric::HostTransports(Transport** local, Transport** cross) {
  return Status::Internal("the local test fabric has no hierarchical transports");
}

int LocalTransportFabric::single_copy_transports() const {
  return transport_ && transport_->single_copy_peers() > 0 ? 1 : 0;
}

int LocalTransportFabric::single_copy_peers() const {
  return transport_ ? transport_->single_copy_peers() : 0;
}

}  // namespace hvdl
