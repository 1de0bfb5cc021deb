// ResponseCache: negotiated names that later cycles agree on with one bit each.
//
// Protocol. Every rank holds an identical cache: entries are inserted, touched and evicted only
// while processing the agreed response list, in list order, so slot numbers match everywhere.
// When a rank submits a name whose request equals the one it submitted when the entry was made, it
// only sets the entry's bit in the cycle's bit vector; the bitwise allreduce then tells every rank
// which cached names are ready everywhere, with no gather to rank 0 and no broadcast. A request
// that differs (new shape, dtype, op, ...) sets the entry's "invalid" bit instead: every rank
// erases the entry and the name goes through full negotiation again.
// Eviction is least-recently-used, where "use" is execution in agreed order.
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/message.h"

namespace hvdl {

class ResponseCache {
 public:
  explicit ResponseCache(size_t capacity);

  size_t capacity() const { return capacity_; }
  // Slots in use or ever used; identical on every rank. The bit vectors cover this many slots.
  size_t num_slots() const { return slots_.size(); }

  enum class Lookup { kMiss, kHit, kInvalid };
  // Classifies this rank's request; `slot` is set for kHit and kInvalid.
  Lookup Find(const Request& request, uint32_t* slot) const;

  // Inserts (or replaces) the entry for `response.name`. `local` is this rank's request for it, or
  // nullptr when this rank did not submit it (other process set, joined); `member` says whether
  // this rank belongs to the response's process set. Returns the slot evicted to make room, if any.
  std::optional<uint32_t> Put(const Response& response, const Request* local, bool member);
  const Response& Get(uint32_t slot) const { return slots_[slot].response; }
  bool Occupied(uint32_t slot) const { return slot < slots_.size() && slots_[slot].used; }
  void Erase(uint32_t slot);
  void Touch(uint32_t slot);  // marks the entry most recently used
  size_t size() const { return by_name_.size(); }
  // Bit s is set when slot s is in use.
  const std::vector<uint64_t>& occupied_mask() const { return occupied_; }
  // Bit s is set when this rank must submit slot s's name before it can run: the slot is unused
  // (so it never looks ready) or this rank is a member of its process set.
  const std::vector<uint64_t>& expect_mask() const { return expect_; }
  // Slots whose response belongs to process set `id`.
  std::vector<uint32_t> SlotsOfProcessSet(int id) const;

 private:
  struct Slot {
    bool used = false;
    Response response;
    bool has_local = false;
    Request local;
    std::list<uint32_t>::iterator lru;
  };
  size_t capacity_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_;  // erased slots, reused lowest-first
  std::unordered_map<std::string, uint32_t> by_name_;  // by TensorKey
  std::list<uint32_t> lru_;  // front = least recently used
  std::vector<uint64_t> occupied_;
  std::vector<uint64_t> expect_;
  void SetBit(std::vector<uint64_t>& v, uint32_t slot, bool on);
};

}  // namespace hvdl
