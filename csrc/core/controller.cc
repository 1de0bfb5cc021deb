#include "core/controller.h"

#include <algorithm>
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

Controller::Controller(ControlPlane* cp, ProcessSetTable* sets, size_t cache_capacity,
                       double stall_seconds, double stall_shutdown_seconds)
    : cp_(cp),
      sets_(sets),
      cache_(cache_capacity),
      table_(sets),
      stall_seconds_(stall_seconds),
      inspector_(stall_seconds, stall_shutdown_seconds) {}

void Controller::Submit(std::vector<Request>& requests) {
  if (requests.empty()) return;
  const TimePoint now = std::chrono::steady_clock::now();
  // only the newest is reported: copied once, not for every request
  const Request& last = requests.back();
  last_ = PendingInfo{last.name, last.op, last.process_set, last.site, 0};
  last_time_ = now;
  for (Request& r : requests) {
    r.rank = cp_->rank();
    TraceStart(r);
    Classify(std::move(r), now);
  }
}

// True at most once per check period, when this rank's oldest request has waited too long.
bool Controller::StallCheckDue() {
  if (stall_seconds_ <= 0 || (since_.empty() && cached_pending_.empty())) return false;
  const TimePoint now = std::chrono::steady_clock::now();
  const auto period = std::chrono::duration<double>(stall_seconds_);
  if (now - last_check_ < period) return false;
  const bool due =
      std::any_of(since_.begin(), since_.end(),
                  [&](const auto& kv) { return now - kv.second >= period; }) ||
      std::any_of(cached_pending_.begin(), cached_pending_.end(),
                  [&](const auto& kv) { return now - kv.second.since >= period; });
  if (due) last_check_ = now;
  return due;
}

RankMessage Controller::ReportPending(std::vector<Request> requests) const {
  RankMessage m;
  m.requests = std::move(requests);
  m.has_report = true;
  const TimePoint now = std::chrono::steady_clock::now();
  auto add = [&](const Request& q, TimePoint since) {
    const double age = std::chrono::duration<double>(now - since).count();
    m.pending.push_back(PendingInfo{q.name, q.op, q.process_set, q.site, age});
  };
  for (const auto& kv : sent_) {
    auto it = since_.find(kv.first);
    add(kv.second, it == since_.end() ? now : it->second);
  }
  for (const auto& kv : cached_pending_) add(kv.second.request, kv.second.since);
  m.last = last_;
  if (!last_.name.empty()) {
    m.last.age_seconds = std::chrono::duration<double>(now - last_time_).count();
  }
  return m;
}

// Agreement reached: account this rank's wait and close the negotiation span on the timeline.
// (Cached responses were accounted in CollectCachedReady.)
void Controller::Forget(const Response& response, bool cached) {
  if (!cached) {
    auto it = since_.find(response.Key());
    if (it != since_.end()) {
      stats_.wait_seconds +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second).count();
      since_.erase(it);
    }
  }
  if (timeline_ != nullptr && timeline_->enabled()) {
    timeline_->NegotiateEnd(response.name, response.process_set, response.op, cached);
  }
}

// On rank 0, a name it takes part in starts its NEGOTIATE span when first heard of.
void Controller::TraceStart(const Request& q) {
  if (timeline_ == nullptr || !timeline_->enabled() || cp_->rank() != 0) return;
  if (q.op == OpType::kShutdown) return;
  if (q.process_set != 0 && sets_->RankIn(q.process_set, 0) < 0) return;  // 0: every rank
  timeline_->NegotiateStart(q.name, q.process_set, q.op, q.dtype, q.shape);
}

void Controller::Classify(Request request, TimePoint now) {
  if (request.op == OpType::kJoin) joined_ = true;
  uint32_t slot = 0;
  ResponseCache::Lookup found = ResponseCache::Lookup::kMiss;
  if (cache_.capacity() > 0 && Cacheable(request.op)) found = cache_.Find(request, &slot);
  // Invariant: a cached name is agreed either through the bit vector on every rank or through
  // the coordinator on every rank. Whenever this rank must use the coordinator for a cached name
  // (here: the fast path is suspended because a rank joined), it invalidates the entry so that
  // every other rank switches too.
  if (cache_suspended_ && found == ResponseCache::Lookup::kHit) {
    found = ResponseCache::Lookup::kInvalid;
  }
  switch (found) {
    case ResponseCache::Lookup::kHit:
      cached_pending_[slot] = CachedPending{std::move(request), now};
      return;
    case ResponseCache::Lookup::kInvalid:
      invalid_.insert(slot);
      break;
    case ResponseCache::Lookup::kMiss:
      break;
  }
  since_[request.Key()] = now;
  unsent_.push_back(std::move(request));
}

void Controller::PublishParams(const TunedParams& params) {
  publish_ = params;
  publish_.present = true;
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
  for (const auto& kv : cached_pending_) names.push_back(kv.second.request.name);
  for (const auto& kv : sent_) names.push_back(kv.second.name);
  return names;
}

// Layout: words_[0] flags; then W words of invalid bits; then W words of not-ready bits.
void Controller::BuildBits() {
  slots_in_cycle_ = cache_.num_slots();
  const size_t w = WordsFor(slots_in_cycle_);
  words_.assign(1 + 2 * w, 0);
  uint64_t flags = 0;
  if (!unsent_.empty() || shutdown_requested_ || publish_.present) flags |= kFlagUncached;
  if (shutdown_requested_) flags |= kFlagShutdown;
  if (StallCheckDue()) flags |= kFlagStall;
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
  since_[it->second.request.Key()] = it->second.since;
  unsent_.push_back(std::move(it->second.request));
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
    // Joined ranks cannot set bits for names they never submit; route everything via rank 0
    // (and invalidate those entries, see Classify).
    while (!cached_pending_.empty()) {
      invalid_.insert(cached_pending_.begin()->first);
      Requeue(cached_pending_.begin()->first);
    }
    return;
  }
  const std::vector<uint64_t>& occupied = cache_.occupied_mask();
  const TimePoint now = std::chrono::steady_clock::now();
  double waited = 0;
  out->responses.reserve(out->responses.size() + cached_pending_.size());
  for (size_t i = 0; i < w && i < occupied.size(); ++i) {
    for (uint64_t bits = ~words_[1 + w + i] & occupied[i]; bits != 0; bits &= bits - 1) {
      uint32_t slot = static_cast<uint32_t>(i * 64 + __builtin_ctzll(bits));
      if (slot >= slots_in_cycle_) continue;
      out->responses.push_back(cache_.Get(slot));
      auto it = cached_pending_.find(slot);
      if (it != cached_pending_.end()) {
        waited += std::chrono::duration<double>(now - it->second.since).count();
        cached_pending_.erase(it);
      }
      cache_.Touch(slot);
      ++out->cache_hits;
    }
  }
  stats_.wait_seconds += waited;
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
  if (flags & kFlagStall) last_check_ = std::chrono::steady_clock::now();  // one per period
  if (flags & (kFlagUncached | kFlagStall)) HVDL_RETURN_IF_ERROR(Negotiate(out, flags));
  if (flags & kFlagShutdown) out->shutdown = true;
  for (size_t i = 0; i < out->responses.size(); ++i) {
    Forget(out->responses[i], static_cast<int>(i) < out->cache_hits);
  }
  stats_.responses += out->responses.size();
  return Status::Ok();
}

Status Controller::Negotiate(CycleResult* out, uint64_t flags) {
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
  RankMessage message;
  if (flags & kFlagStall) {
    message = ReportPending(std::move(mine));
  } else {
    message.requests = std::move(mine);
  }
  std::vector<std::string> gathered;
  HVDL_RETURN_IF_ERROR(cp_->Gather(SerializeRankMessage(message), &gathered));
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
  out->params = list.params;
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
  std::vector<RankMessage> messages(gathered.size());
  for (size_t r = 0; r < gathered.size(); ++r) {
    Status s = ParseRankMessage(gathered[r], &messages[r]);
    HVDL_CHECK(s.ok(), "rank " + std::to_string(r) + " sent a corrupt message: " + s.message());
    for (const Request& q : messages[r].requests) {
      TraceStart(q);
      if (timeline_ != nullptr && timeline_->enabled()) {
        timeline_->RankReady(q.name, q.process_set, q.rank);
      }
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
  if (!messages.empty() && messages[0].has_report) {
    StallVerdict verdict = inspector_.Inspect(messages, *sets_);
    if (!verdict.report.empty()) HVDL_LOG(Warning) << verdict.report;
    if (verdict.shutdown) {
      list.shutdown = true;
      if (!list.shutdown_reason.empty()) list.shutdown_reason += "; ";
      list.shutdown_reason += verdict.report;
    }
  }
  if (hook_) hook_(table_, &list);
  list.params = publish_;
  publish_ = TunedParams();
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
