#include "core/controller.h"

#include <unordered_set>

#include "common/logging.h"

namespace hvdl {
namespace {

bool Cacheable(OpType op) {
  return op == OpType::kAllreduce || op == OpType::kAllgather || op == OpType::kBroadcast ||
         op == OpType::kAlltoall || op == OpType::kReducescatter;
}

size_t WordsFor(size_t slots) { return (slots + 63) / 64; }

}  // namespace

Controller::Controller(ControlPlane* cp, ProcessSetTable* sets, size_t cache_capacity)
    : cp_(cp), sets_(sets), cache_(cache_capacity), table_(sets) {}

void Controller::Submit(std::vector<Request> requests) {
  for (Request& r : requests) {
    r.rank = cp_->rank();
    Classify(std::move(r));
  }
}

void Controller::Classify(Request request) {
  if (request.op == OpType::kJoin) joined_ = true;
  uint32_t slot = 0;
  ResponseCache::Lookup found = ResponseCache::Lookup::kMiss;
  if (cache_.capacity() > 0 && !cache_suspended_ && Cacheable(request.op)) {
    found = cache_.Find(request, &slot);
  }
  switch (found) {
    case ResponseCache::Lookup::kHit:
      cached_pending_[slot] = std::move(request);
      break;
    case ResponseCache::Lookup::kInvalid:
      invalid_.insert(slot);
      unsent_.push_back(std::move(request));
      break;
    case ResponseCache::Lookup::kMiss:
      unsent_.push_back(std::move(request));
      break;
  }
}

void Controller::RequestShutdown(const std::string& reason) {
  if (shutdown_requested_) return;
  shutdown_requested_ = true;
  shutdown_reason_ = reason;
}

size_t Controller::num_pending() const {
  return unsent_.size() + cached_pending_.size() + sent_.size();
}

std::vector<std::string> Controller::PendingNames() const {
  std::vector<std::string> names;
  for (const Request& r : unsent_) names.push_back(r.name);
  for (const auto& kv : cached_pending_) names.push_back(kv.second.name);
  for (const auto& kv : sent_) names.push_back(kv.second.name);
  return names;
}

// Layout: words_[0] flags; then W words of invalid bits; then W words of not-ready bits.
void Controller::BuildBits() {
  slots_in_cycle_ = cache_.num_slots();
  const size_t w = WordsFor(slots_in_cycle_);
  words_.assign(1 + 2 * w, 0);
  uint64_t flags = 0;
  if (!unsent_.empty() || shutdown_requested_) flags |= kFlagUncached;
  if (shutdown_requested_) flags |= kFlagShutdown;
  if (num_pending() > 0) flags |= kFlagPending;
  if (joined_) flags |= kFlagJoined;
  words_[0] = flags;
  for (uint32_t s : invalid_) words_[1 + s / 64] |= uint64_t{1} << (s % 64);
  invalid_.clear();
  const std::vector<uint64_t>& expect = cache_.expect_mask();
  for (size_t i = 0; i < w; ++i) words_[1 + w + i] = i < expect.size() ? expect[i] : ~uint64_t{0};
  for (const auto& kv : cached_pending_) {
    words_[1 + w + kv.first / 64] &= ~(uint64_t{1} << (kv.first % 64));
  }
}

Status Controller::StartCycle() {
  BuildBits();
  ++stats_.cycles;
  return cp_->StartBitwiseOr(words_.data(), words_.size());
}

Status Controller::TestCycle(bool* done) { return cp_->TestBitwiseOr(done); }

void Controller::Requeue(uint32_t slot) {
  auto it = cached_pending_.find(slot);
  if (it == cached_pending_.end()) return;
  unsent_.push_back(std::move(it->second));
  cached_pending_.erase(it);
}

void Controller::ApplyInvalidations(size_t w) {
  for (size_t i = 0; i < w; ++i) {
    for (uint64_t bits = words_[1 + i]; bits != 0; bits &= bits - 1) {
      uint32_t slot = static_cast<uint32_t>(i * 64 + __builtin_ctzll(bits));
      if (slot >= slots_in_cycle_) continue;
      Requeue(slot);
      cache_.Erase(slot);
      ++stats_.invalidations;
    }
  }
}

void Controller::CollectCachedReady(size_t w, CycleResult* out) {
  cache_suspended_ = (words_[0] & kFlagJoined) != 0;
  if (cache_suspended_) {
    // Joined ranks cannot set bits for names they never submit; route everything via rank 0.
    while (!cached_pending_.empty()) Requeue(cached_pending_.begin()->first);
    return;
  }
  const std::vector<uint64_t>& occupied = cache_.occupied_mask();
  for (size_t i = 0; i < w && i < occupied.size(); ++i) {
    for (uint64_t bits = ~words_[1 + w + i] & occupied[i]; bits != 0; bits &= bits - 1) {
      uint32_t slot = static_cast<uint32_t>(i * 64 + __builtin_ctzll(bits));
      if (slot >= slots_in_cycle_) continue;
      out->responses.push_back(cache_.Get(slot));
      cached_pending_.erase(slot);
      cache_.Touch(slot);
      ++out->cache_hits;
    }
  }
}

Status Controller::FinishCycle(CycleResult* out) {
  *out = CycleResult();
  out->this_rank_joined = joined_;
  const size_t w = WordsFor(slots_in_cycle_);
  const uint64_t flags = words_[0];
  out->anyone_pending = (flags & kFlagPending) != 0;
  ApplyInvalidations(w);
  CollectCachedReady(w, out);
  stats_.cache_hits += static_cast<uint64_t>(out->cache_hits);
  if (flags & kFlagUncached) HVDL_RETURN_IF_ERROR(Negotiate(out));
  if (flags & kFlagShutdown) out->shutdown = true;
  stats_.responses += out->responses.size();
  return Status::Ok();
}

Status Controller::Negotiate(CycleResult* out) {
  std::vector<Request> mine = std::move(unsent_);
  unsent_.clear();
  for (const Request& r : mine) sent_[r.Key()] = r;
  if (shutdown_requested_) {
    Request notice;
    notice.op = OpType::kShutdown;
    notice.name = "__shutdown__";
    notice.rank = cp_->rank();
    notice.site = shutdown_reason_;
    mine.push_back(std::move(notice));
  }
  std::vector<std::string> gathered;
  HVDL_RETURN_IF_ERROR(cp_->Gather(SerializeRequests(mine), &gathered));
  std::string bytes;
  if (cp_->rank() == 0) bytes = SerializeResponses(Coordinate(gathered));
  HVDL_RETURN_IF_ERROR(cp_->Broadcast(&bytes));
  ResponseList list;
  HVDL_RETURN_IF_ERROR(ParseResponses(bytes, &list));
  ++stats_.negotiations;
  out->negotiated = true;
  if (list.shutdown) {
    out->shutdown = true;
    out->shutdown_reason = list.shutdown_reason;
  }
  UpdateCache(list.responses);
  for (const Response& resp : list.responses) {
    sent_.erase(resp.Key());
    if (resp.op == OpType::kJoin) joined_ = false;
  }
  out->responses.insert(out->responses.end(), std::make_move_iterator(list.responses.begin()),
                        std::make_move_iterator(list.responses.end()));
  return Status::Ok();
}

ResponseList Controller::Coordinate(const std::vector<std::string>& gathered) {
  ResponseList list;
  std::vector<std::string> ready;
  for (size_t r = 0; r < gathered.size(); ++r) {
    std::vector<Request> requests;
    Status s = ParseRequests(gathered[r], &requests);
    HVDL_CHECK(s.ok(), "rank " + std::to_string(r) + " sent a corrupt request list: " + s.message());
    for (const Request& q : requests) {
      if (q.op == OpType::kShutdown) {
        list.shutdown = true;
        if (!list.shutdown_reason.empty()) list.shutdown_reason += "; ";
        list.shutdown_reason += "rank " + std::to_string(q.rank) + ": " + q.site;
      } else if (q.op == OpType::kJoin) {
        table_.Join(q.rank, &ready);
      } else {
        table_.Add(q, &ready);
      }
    }
  }
  std::unordered_set<std::string> seen;
  for (const std::string& key : ready) {
    if (seen.insert(key).second) list.responses.push_back(table_.Take(key));
  }
  if (table_.AllJoined(cp_->size())) {
    Response join;
    join.op = OpType::kJoin;
    join.name = "join";
    join.sizes = {table_.last_joined()};
    list.responses.push_back(std::move(join));
    table_.ResetJoins();
  }
  if (hook_) hook_(table_, &list);
  return list;
}

void Controller::UpdateCache(const std::vector<Response>& negotiated) {
  if (cache_.capacity() == 0) return;
  for (const Response& resp : negotiated) {
    if (resp.is_error() || !Cacheable(resp.op)) continue;
    auto mine = sent_.find(resp.Key());
    const Request* local = mine == sent_.end() ? nullptr : &mine->second;
    bool member = sets_->RankIn(resp.process_set, cp_->rank()) >= 0;
    std::optional<uint32_t> evicted = cache_.Put(resp, local, member);
    if (evicted) Requeue(*evicted);
  }
}

void Controller::ForgetProcessSet(int id) {
  for (uint32_t slot : cache_.SlotsOfProcessSet(id)) {
    Requeue(slot);
    cache_.Erase(slot);
  }
}

}  // namespace hvdl
