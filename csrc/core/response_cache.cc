#include "core/response_cache.h"

#include <algorithm>

namespace hvdl {

ResponseCache::ResponseCache(size_t capacity) : capacity_(capacity) {}

ResponseCache::Lookup ResponseCache::Find(const Request& request, uint32_t* slot) const {
  auto it = by_name_.find(request.Key());
  if (it == by_name_.end()) return Lookup::kMiss;
  *slot = it->second;
  const Slot& s = slots_[it->second];
  if (s.has_local && s.local.SameSignature(request)) return Lookup::kHit;
  return Lookup::kInvalid;
}

void ResponseCache::SetBit(std::vector<uint64_t>& v, uint32_t slot, bool on) {
  size_t w = slot / 64;
  if (v.size() <= w) v.resize(w + 1, 0);
  uint64_t bit = uint64_t{1} << (slot % 64);
  v[w] = on ? (v[w] | bit) : (v[w] & ~bit);
}

std::vector<uint32_t> ResponseCache::SlotsOfProcessSet(int id) const {
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < slots_.size(); ++s) {
    if (slots_[s].used && slots_[s].response.process_set == id) out.push_back(s);
  }
  return out;
}

std::optional<uint32_t> ResponseCache::Put(const Response& response, const Request* local,
                                           bool member) {
  if (capacity_ == 0) return std::nullopt;
  std::optional<uint32_t> evicted;
  auto existing = by_name_.find(response.Key());
  if (existing != by_name_.end()) Erase(existing->second);
  uint32_t slot;
  if (!free_.empty()) {
    auto lowest = std::min_element(free_.begin(), free_.end());
    slot = *lowest;
    free_.erase(lowest);
  } else if (slots_.size() < capacity_) {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  } else {
    slot = lru_.front();
    Erase(slot);
    free_.pop_back();
    evicted = slot;
  }
  Slot& s = slots_[slot];
  s.used = true;
  s.response = response;
  s.has_local = local != nullptr;
  if (local != nullptr) s.local = *local;
  s.lru = lru_.insert(lru_.end(), slot);
  by_name_[response.Key()] = slot;
  SetBit(occupied_, slot, true);
  SetBit(expect_, slot, member);
  return evicted;
}

void ResponseCache::Erase(uint32_t slot) {
  Slot& s = slots_[slot];
  if (!s.used) return;
  by_name_.erase(s.response.Key());
  lru_.erase(s.lru);
  s.used = false;
  s.has_local = false;
  free_.push_back(slot);
  SetBit(occupied_, slot, false);
  SetBit(expect_, slot, true);
}

void ResponseCache::Touch(uint32_t slot) {
  Slot& s = slots_[slot];
  if (!s.used) return;
  lru_.splice(lru_.end(), lru_, s.lru);
}

}  // namespace hvdl
