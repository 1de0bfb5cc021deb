#include "core/stall_inspector.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

namespace hvdl {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string At(const std::string& site) { return site.empty() ? "" : " at " + site; }

struct Waiting {
  const PendingInfo* any = nullptr;
  std::map<int, const PendingInfo*> by_rank;  // ranks that submitted
  double oldest = 0;
};

}  // namespace

StallVerdict StallInspector::Inspect(const std::vector<RankMessage>& messages,
                                     const ProcessSetTable& sets) const {
  std::map<std::string, Waiting> waiting;  // by TensorKey, sorted for a stable report
  for (size_t r = 0; r < messages.size(); ++r) {
    for (const PendingInfo& p : messages[r].pending) {
      Waiting& w = waiting[TensorKey(p.name, p.process_set)];
      w.any = &p;
      w.by_rank[static_cast<int>(r)] = &p;
      w.oldest = std::max(w.oldest, p.age_seconds);
    }
  }
  std::ostringstream os;
  StallVerdict verdict;
  int stalled = 0;
  for (const auto& [key, w] : waiting) {
    if (w.oldest < warn_seconds_) continue;
    std::vector<int> members = sets.Members(w.any->process_set).value_or(std::vector<int>{});
    std::vector<int> missing;
    for (int m : members) {
      if (!w.by_rank.count(m)) missing.push_back(m);
    }
    if (missing.empty()) continue;  // everyone is there; it will run
    ++stalled;
    os << "\n  " << TensorLabel(OpTypeName(w.any->op), w.any->name);
    if (w.any->process_set != 0) os << " (process set " << w.any->process_set << ")";
    os << ": waited " << Seconds(w.oldest) << ".\n    submitted by:";
    for (const auto& [rank, p] : w.by_rank) os << " rank " << rank << At(p->site) << ";";
    os << "\n    missing on:";
    for (int m : missing) {
      const PendingInfo& last = messages[static_cast<size_t>(m)].last;
      os << " rank " << m;
      if (last.name.empty()) {
        os << " (no collective submitted yet);";
      } else {
        os << " (its last submission: " << TensorLabel(OpTypeName(last.op), last.name)
           << At(last.site) << ", " << Seconds(last.age_seconds) << " ago);";
      }
    }
    if (shutdown_seconds_ > 0 && w.oldest >= shutdown_seconds_) verdict.shutdown = true;
  }
  if (stalled == 0) return verdict;
  verdict.report = "stall: " + std::to_string(stalled) + " collective" + (stalled > 1 ? "s" : "") +
                   " waiting for ranks that have not submitted them:" + os.str() +
                   "\n  Every rank must submit the same names (a rank that skips a collective "
                   "in a branch, exits early or sees fewer batches stalls the others).";
  return verdict;
}

}  // namespace hvdl
