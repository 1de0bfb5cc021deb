#include "core/message_table.h"

#include <algorithm>

#include "core/response_builder.h"

namespace hvdl {

MessageTable::MessageTable(const ProcessSetTable* sets) : sets_(sets) {}

bool MessageTable::Complete(const Entry& e, const std::vector<int>& members) const {
  for (size_t i = 0; i < members.size(); ++i) {
    if (e.by_member[i].name.empty() && !HasJoined(members[i])) return false;
  }
  return e.submitted > 0;
}

// O(log members) per request: the coordinator adds every rank's request of every tensor, so a
// copy of the member list or a scan of the entry here made a negotiation O(ranks^2) per tensor
// (at 1,024 simulated ranks: 7.4x the time of 256 for 4x the ranks; benchmarks/scale.py).
void MessageTable::Add(const Request& request, std::vector<std::string>* ready) {
  const size_t size = static_cast<size_t>(sets_->Size(request.process_set));
  int pos = sets_->RankIn(request.process_set, request.rank);
  if (size == 0 || pos < 0) return;  // validated at call time; a stale set is ignored
  const std::string key = request.Key();
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    Entry e;
    e.by_member.resize(size);
    e.process_set = request.process_set;
    e.first_seen = std::chrono::steady_clock::now();
    e.order = order_.insert(order_.end(), key);
    it = entries_.emplace(key, std::move(e)).first;
  }
  Entry& e = it->second;
  if (e.by_member.size() != size) return;
  if (e.by_member[pos].name.empty()) ++e.submitted;
  e.by_member[pos] = request;
  if (static_cast<size_t>(e.submitted) == size) {
    ready->push_back(key);
  } else if (!joined_.empty()) {  // joined members count as present: the full check
    auto members = sets_->Members(request.process_set);
    if (members && Complete(e, *members)) ready->push_back(key);
  }
}

void MessageTable::Join(int rank, std::vector<std::string>* ready) {
  if (!HasJoined(rank)) joined_.push_back(rank);
  last_joined_ = rank;
  for (const std::string& key : order_) {
    const Entry& e = entries_.at(key);
    auto members = sets_->Members(e.process_set);
    if (!members) continue;
    bool was_waiting_on_rank = false;
    for (size_t i = 0; i < members->size(); ++i) {
      if ((*members)[i] == rank && e.by_member[i].name.empty()) was_waiting_on_rank = true;
    }
    if (was_waiting_on_rank && Complete(e, *members)) ready->push_back(key);
  }
}

bool MessageTable::HasJoined(int rank) const {
  return std::find(joined_.begin(), joined_.end(), rank) != joined_.end();
}

bool MessageTable::AllJoined(int world_size) const {
  return static_cast<int>(joined_.size()) == world_size;
}

void MessageTable::ResetJoins() {
  joined_.clear();
  last_joined_ = -1;
}

Response MessageTable::Take(const std::string& key) {
  Entry& e = entries_.at(key);
  std::vector<const Request*> reqs;
  std::vector<int> members = sets_->Members(e.process_set).value_or(std::vector<int>{});
  for (const Request& q : e.by_member) reqs.push_back(q.name.empty() ? nullptr : &q);
  Response resp = BuildResponse(reqs, members);
  order_.erase(e.order);
  entries_.erase(key);
  return resp;
}

std::vector<WaitingName> MessageTable::Incomplete(double min_age_seconds) const {
  std::vector<WaitingName> out;
  auto now = std::chrono::steady_clock::now();
  for (const std::string& key : order_) {
    const Entry& e = entries_.at(key);
    double age = std::chrono::duration<double>(now - e.first_seen).count();
    if (age < min_age_seconds) continue;
    WaitingName w;
    w.age_seconds = age;
    w.process_set = e.process_set;
    for (const Request& q : e.by_member) {
      if (!q.name.empty()) w.op = q.op;
    }
    auto members = sets_->Members(w.process_set).value_or(std::vector<int>{});
    for (size_t i = 0; i < members.size() && i < e.by_member.size(); ++i) {
      if (!e.by_member[i].name.empty()) {
        w.name = e.by_member[i].name;
        w.submitted.push_back(members[i]);
        w.sites.push_back(e.by_member[i].site);
      } else if (!HasJoined(members[i])) {
        w.missing.push_back(members[i]);
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace hvdl
