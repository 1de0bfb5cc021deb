// ProcessSetTable: which global ranks belong to which process set.
//
// Set 0 is the global set (every rank). Other sets are added and removed by collective operations
// that every rank executes in the same agreed order, so the table is identical on every rank. User
// threads read it to validate arguments; the background thread changes it; a mutex guards both.
#pragma once

#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace hvdl {

class ProcessSetTable {
 public:
  explicit ProcessSetTable(int world_size);

  // Registers `ranks` (sorted, unique global ranks) under `id`.
  void Add(int id, std::vector<int> ranks);
  void Remove(int id);
  bool Exists(int id) const;
  // The members of set `id` in ascending global-rank order; nullopt if unknown.
  std::optional<std::vector<int>> Members(int id) const;
  // Position of `global_rank` within set `id`, or -1 if it is not a member (or the set is unknown).
  int RankIn(int id, int global_rank) const;
  int Size(int id) const;  // 0 if unknown
  // The id a new dynamic set would get (one past the largest id ever used).
  int NextId() const;
  // The id of a set with exactly these members, or -1.
  int Find(const std::vector<int>& ranks) const;
  std::vector<int> Ids() const;

 private:
  mutable std::mutex mu_;
  std::map<int, std::vector<int>> sets_;
  int next_id_ = 1;
};

}  // namespace hvdl
