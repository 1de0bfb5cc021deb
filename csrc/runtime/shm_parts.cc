#include "runtime/shm_parts.h"

#include <chrono>

#include "backends/shm/shm_control_plane.h"
#include "backends/shm/shm_transport.h"
#include "comm/single_copy_transport.h"

namespace hvdl {

ShmParts::ShmParts(std::string prefix, int rank, double timeout_seconds, bool single_copy)
    : prefix_(std::move(prefix)),
      rank_(rank),
      timeout_seconds_(timeout_seconds),
      single_copy_(single_copy) {}

Status ShmParts::Attach(const std::vector<int>& members, const std::string& what,
                        ShmGroupOptions options, std::shared_ptr<ShmGroup>* out) {
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds_ * 1000));
  int me = -1;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == rank_) me = static_cast<int>(i);
    options.names.push_back("rank " + std::to_string(members[i]));
  }
  HVDL_RETURN_IF_ERROR(ShmGroup::Attach(prefix_ + "-" + what, me,
                                        static_cast<int>(members.size()), options, out));
  std::lock_guard<std::mutex> lock(mu_);
  groups_.push_back(*out);
  return Status::Ok();
}

LocalParts ShmParts::Parts() {
  LocalParts parts;
  parts.transport = [this](const std::vector<int>& members, const std::string& what,
                           std::unique_ptr<Transport>* out) {
    std::shared_ptr<ShmGroup> group;
    HVDL_RETURN_IF_ERROR(Attach(members, what, ShmGroupOptions(), &group));
    std::unique_ptr<Transport> t = std::make_unique<ShmTransport>(group);
    if (single_copy_) {  // every member is on this host: the probe pairs them all
      t = std::make_unique<SingleCopyTransport>(std::move(t),
                                                std::vector<std::string>(members.size(), "here"));
    }
    *out = std::move(t);
    return Status::Ok();
  };
  parts.control = [this](const std::vector<int>& members, size_t words,
                         std::unique_ptr<ControlPlane>* out) {
    std::shared_ptr<ShmGroup> group;
    HVDL_RETURN_IF_ERROR(Attach(members, "control", ShmControlPlane::GroupOptions(words), &group));
    *out = std::make_unique<ShmControlPlane>(group);
    return Status::Ok();
  };
  return parts;
}

void ShmParts::Cancel(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& weak : groups_) {
    if (auto g = weak.lock()) g->Cancel(why);
  }
}

}  // namespace hvdl
