#include "core/process_set.h"

#include <algorithm>
#include <numeric>

namespace hvdl {

ProcessSetTable::ProcessSetTable(int world_size) {
  std::vector<int> all(static_cast<size_t>(world_size));
  std::iota(all.begin(), all.end(), 0);
  sets_[0] = std::move(all);
}

void ProcessSetTable::Add(int id, std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  sets_[id] = std::move(ranks);
  next_id_ = std::max(next_id_, id + 1);
}

void ProcessSetTable::Remove(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id != 0) sets_.erase(id);
}

bool ProcessSetTable::Exists(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sets_.count(id) != 0;
}

std::optional<std::vector<int>> ProcessSetTable::Members(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return std::nullopt;
  return it->second;
}

int ProcessSetTable::RankIn(int id, int global_rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return -1;
  auto pos = std::lower_bound(it->second.begin(), it->second.end(), global_rank);
  if (pos == it->second.end() || *pos != global_rank) return -1;
  return static_cast<int>(pos - it->second.begin());
}

int ProcessSetTable::Size(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sets_.find(id);
  return it == sets_.end() ? 0 : static_cast<int>(it->second.size());
}

int ProcessSetTable::NextId() const {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_;
}

int ProcessSetTable::Find(const std::vector<int>& ranks) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, members] : sets_) {
    if (members == ranks) return id;
  }
  return -1;
}

std::vector<int> ProcessSetTable::Ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> ids;
  for (const auto& kv : sets_) ids.push_back(kv.first);
  return ids;
}

}  // namespace hvdl
