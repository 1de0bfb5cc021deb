#include "backends/gloo/gloo_fabric.h"

#include <algorithm>
#include <climits>

#include "backends/gloo/gloo_transport.h"

namespace hvdl {

GlooFabric::GlooFabric(c10::intrusive_ptr<c10d::Backend> backend, const GlooLaunch& launch,
                       GlooWaits* waits)
    : backend_(std::move(backend)), launch_(launch), waits_(waits), homogeneous_(true) {
  std::vector<int> all(static_cast<size_t>(launch.size));
  for (int r = 0; r < launch.size; ++r) all[static_cast<size_t>(r)] = r;
  members_[0] = std::move(all);
  std::map<std::string, int> per_host;
  for (const std::string& h : launch.hosts) ++per_host[h];
  for (const auto& kv : per_host) homogeneous_ = homogeneous_ && kv.second == launch.local_size;
}

std::unique_ptr<Transport> GlooFabric::Make(const std::vector<int>& members, int tag_base) const {
  int me = -1;
  std::vector<std::string> names;
  for (size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r == launch_.rank) me = static_cast<int>(i);
    names.push_back("rank " + std::to_string(r) + " (host " +
                    launch_.hosts[static_cast<size_t>(r)] + ")");
  }
  return std::make_unique<GlooTransport>(backend_, members, me, tag_base, std::move(names),
                                         waits_);
}

Status GlooFabric::AddProcessSet(int ps, const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  members_[ps] = std::move(sorted);
  return Status::Ok();
}

Status GlooFabric::RemoveProcessSet(int ps) {
  transports_.erase(ps);
  if (ps != 0) members_.erase(ps);
  return Status::Ok();
}

int GlooFabric::SetSize(int ps) const {
  return SetRank(ps) < 0 ? 0 : static_cast<int>(members_.at(ps).size());
}

int GlooFabric::SetRank(int ps) const {
  auto it = members_.find(ps);
  if (it == members_.end()) return -1;
  auto at = std::find(it->second.begin(), it->second.end(), launch_.rank);
  return at == it->second.end() ? -1 : static_cast<int>(at - it->second.begin());
}

Status GlooFabric::SetTransport(int ps, Transport** out) {
  auto it = transports_.find(ps);
  if (it == transports_.end()) {
    if (SetRank(ps) < 0) {
      return Status::Internal("rank " + std::to_string(launch_.rank) +
                              " is not a member of process set " + std::to_string(ps));
    }
    if (ps >= INT_MAX / kTagsPerSet - 2) return Status::Internal("process set id too large");
    it = transports_.emplace(ps, Make(members_.at(ps), (ps + 2) * kTagsPerSet)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

bool GlooFabric::hierarchical() const {
  return launch_.cross_size > 1 && launch_.local_size > 1 && homogeneous_;
}

Status GlooFabric::HostTransports(Transport** local, Transport** cross) {
  if (!local_) {
    std::vector<int> here, across;
    const std::string& mine = launch_.hosts[static_cast<size_t>(launch_.rank)];
    std::map<std::string, int> seen;  // host -> how many of its ranks came before
    for (int r = 0; r < launch_.size; ++r) {
      const std::string& h = launch_.hosts[static_cast<size_t>(r)];
      const int local_rank = seen[h]++;
      if (h == mine) here.push_back(r);
      if (local_rank == launch_.local_rank) across.push_back(r);
    }
    local_ = Make(here, 0);
    cross_ = Make(across, kTagsPerSet);
  }
  *local = local_.get();
  *cross = cross_.get();
  return Status::Ok();
}

}  // namespace hvdl
