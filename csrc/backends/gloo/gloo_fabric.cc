#include "backends/gloo/gloo_fabric.h"

#include <algorithm>
#include <climits>

#include "backends/gloo/gloo_transport.h"
#include "comm/routed_transport.h"

namespace hvdl {

GlooFabric::GlooFabric(c10::intrusive_ptr<c10d::Backend> backend, const GlooLaunch& launch,
                       GlooWaits* waits, LocalParts local)
    : backend_(std::move(backend)),
      launch_(launch),
      waits_(waits),
      local_parts_(std::move(local)),
      homogeneous_(true) {
  std::vector<int> all(static_cast<size_t>(launch.size));
  for (int r = 0; r < launch.size; ++r) all[static_cast<size_t>(r)] = r;
  members_[0] = std::move(all);
  std::map<std::string, int> per_host;
  for (const std::string& h : launch.hosts) ++per_host[h];
  for (const auto& kv : per_host) homogeneous_ = homogeneous_ && kv.second == launch.local_size;
}

std::string GlooFabric::Name(int rank) const {
  return "rank " + std::to_string(rank) + " (host " + launch_.hosts[static_cast<size_t>(rank)] +
         ")";
}

bool GlooFabric::Here(int rank) const {
  return launch_.hosts[static_cast<size_t>(rank)] ==
         launch_.hosts[static_cast<size_t>(launch_.rank)];
}

// Without a process group (one host) only a transport of this rank alone is ever made here.
std::unique_ptr<Transport> GlooFabric::Gloo(const std::vector<int>& members, int tag_base) const {
  int me = -1;
  std::vector<std::string> names;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == launch_.rank) me = static_cast<int>(i);
    names.push_back(Name(members[i]));
  }
  return std::make_unique<GlooTransport>(backend_, members, me, tag_base, std::move(names),
                                         waits_, launch_.connections);
}

// The local transport to the members here, Gloo to the others; one kind alone needs no routing.
Status GlooFabric::Make(const std::vector<int>& members, const std::string& what, int tag_base,
                        std::unique_ptr<Transport>* out) const {
  std::vector<int> here;
  for (int r : members) {
    if (Here(r)) here.push_back(r);
  }
  if (here.size() == members.size() && here.size() > 1) {
    return local_parts_.transport(members, what, out);
  }
  if (here.size() <= 1) {
    *out = Gloo(members, tag_base);
    return Status::Ok();
  }
  std::vector<std::unique_ptr<Transport>> parts(2);
  HVDL_RETURN_IF_ERROR(local_parts_.transport(here, what, &parts[0]));
  parts[1] = Gloo(members, tag_base);
  std::vector<RoutedTransport::Route> routes;
  int me = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    const int r = members[i];
    if (r == launch_.rank) me = static_cast<int>(i);
    if (Here(r)) {
      const int at = static_cast<int>(std::find(here.begin(), here.end(), r) - here.begin());
      routes.push_back({0, at});
    } else {
      routes.push_back({1, static_cast<int>(i)});
    }
  }
  *out = std::make_unique<RoutedTransport>(std::move(parts), std::move(routes), me);
  return Status::Ok();
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

// Collective over the set's members (they reach their first collective of the set in the same
// agreed order).
Status GlooFabric::SetTransport(int ps, Transport** out) {
  auto it = transports_.find(ps);
  if (it == transports_.end()) {
    if (SetRank(ps) < 0) {
      return Status::Internal("rank " + std::to_string(launch_.rank) +
                              " is not a member of process set " + std::to_string(ps));
    }
    if (ps >= INT_MAX / (kTagsPerSet * std::max(1, launch_.connections)) - 2) {
      return Status::Internal("process set id too large");
    }
    std::unique_ptr<Transport> t;
    HVDL_RETURN_IF_ERROR(Make(members_.at(ps), "ps" + std::to_string(ps),
                              (ps + 2) * kTagsPerSet, &t));
    it = transports_.emplace(ps, std::move(t)).first;
  }
  *out = it->second.get();
  return Status::Ok();
}

bool GlooFabric::hierarchical() const {
  return launch_.cross_size > 1 && launch_.local_size > 1 && homogeneous_;
}

// Collective over the job, at the first hierarchical collective.
Status GlooFabric::HostTransports(Transport** local, Transport** cross) {
  if (!local_) {
    std::vector<int> here, across;
    std::map<std::string, int> seen;  // host -> how many of its ranks came before
    for (int r = 0; r < launch_.size; ++r) {
      const int local_rank = seen[launch_.hosts[static_cast<size_t>(r)]]++;
      if (Here(r)) here.push_back(r);
      if (local_rank == launch_.local_rank) across.push_back(r);
    }
    HVDL_RETURN_IF_ERROR(Make(here, "host", 0, &local_));
    cross_ = Gloo(across, kTagsPerSet);
  }
  *local = local_.get();
  *cross = cross_.get();
  return Status::Ok();
}

std::vector<std::vector<int>> GlooFabric::LocalRankColumns() const {
  std::vector<std::vector<int>> columns(static_cast<size_t>(launch_.local_size));
  std::map<std::string, int> seen;  // host -> how many of its ranks came before
  for (int r = 0; r < launch_.size; ++r) {
    const int local_rank = seen[launch_.hosts[static_cast<size_t>(r)]]++;
    if (local_rank < launch_.local_size) columns[static_cast<size_t>(local_rank)].push_back(r);
  }
  return columns;
}

int GlooFabric::single_copy_transports() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers() > 0 ? 1 : 0;
  return n;
}

int GlooFabric::single_copy_peers() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers();
  return n;
}

}  // namespace hvdl
