// MessageTable: the coordinator's (rank 0's) record of which ranks have submitted which names.
//
// Requests arrive in gathered batches (rank 0's, then rank 1's, ...). A name is complete when every
// member of its process set has submitted it, or has joined (hvd.join) and will contribute zeros.
// Complete names are reported in the order they completed; that order is the execution order every
// rank follows, so it must only depend on the gathered data, never on timing on the coordinator.
#pragma once

#include <chrono>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"
#include "core/process_set.h"

namespace hvdl {

struct WaitingName {
  std::string name;
  OpType op = OpType::kAllreduce;
  int process_set = 0;
  double age_seconds = 0;
  std::vector<int> submitted;         // global ranks that submitted
  std::vector<std::string> sites;     // their call sites, same order
  std::vector<int> missing;           // global ranks that did not
};

class MessageTable {
 public:
  explicit MessageTable(const ProcessSetTable* sets);

  // Records one rank's request; appends the keys (TensorKey) that became complete to `ready`.
  void Add(const Request& request, std::vector<std::string>* ready);
  // Marks `rank` as joined; appends names that became complete because of it.
  void Join(int rank, std::vector<std::string>* ready);
  bool HasJoined(int rank) const;
  bool AllJoined(int world_size) const;
  int last_joined() const { return last_joined_; }
  void ResetJoins();

  // Builds the response for a complete key (validated; an error response on mismatch) and
  // forgets it.
  Response Take(const std::string& key);

  // Names submitted by some members but not all, older than `min_age_seconds`.
  std::vector<WaitingName> Incomplete(double min_age_seconds) const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<Request> by_member;  // indexed by set-relative rank; name empty = not submitted
    int submitted = 0;
    int process_set = 0;
    std::chrono::steady_clock::time_point first_seen;
    std::list<std::string>::iterator order;
  };
  bool Complete(const Entry& e, const std::vector<int>& members) const;

  const ProcessSetTable* sets_;
  std::unordered_map<std::string, Entry> entries_;  // by TensorKey
  std::list<std::string> order_;  // keys in first-seen order, for deterministic rescans
  std::vector<int> joined_;       // global ranks, in join order
  int last_joined_ = -1;
};

}  // namespace hvdl
