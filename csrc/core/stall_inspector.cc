#include "core/stall_inspector.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

namespace hvdl {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string At(const std::string& site) { return site.empty() ? "" : " at " + site; }

// (rank, text) pairs in rank order -> (" rank 3" or " ranks 0-2", text) for each run of
// consecutive ranks with the same text.
std::vector<std::pair<std::string, std::string>> Runs(
    const std::vector<std::pair<int, std::string>>& items) {
  std::vector<std::pair<std::string, std::string>> out;
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    while (j + 1 < items.size() && items[j + 1].first == items[j].first + 1 &&
           items[j + 1].second == items[i].second) {
      ++j;
    }
    std::string ranks = j == i ? " rank " + std::to_string(items[i].first)
                               : " ranks " + std::to_string(items[i].first) + "-" +
                                     std::to_string(items[j].first);
    std::string text = items[i].second;
    if (j > i && text.rfind(" (its ", 0) == 0) text.replace(2, 3, "their");  // several ranks
    out.emplace_back(std::move(ranks), std::move(text));
    i = j + 1;
  }
  return out;
}

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
    // Consecutive ranks that say the same are one entry ("ranks 0-1022 at train.py:42"), so a
    // report stays short at a thousand ranks.
    std::vector<std::pair<int, std::string>> submitted;
    for (const auto& [rank, p] : w.by_rank) submitted.emplace_back(rank, At(p->site));
    for (const auto& [ranks, text] : Runs(submitted)) os << ranks << text << ";";
    os << "\n    missing on:";
    std::vector<std::pair<int, std::string>> absent;
    for (int m : missing) {
      const PendingInfo& last = messages[static_cast<size_t>(m)].last;
      absent.emplace_back(m, last.name.empty()
                                 ? std::string(" (no collective submitted yet)")
                                 : " (its last submission: " +
                                       TensorLabel(OpTypeName(last.op), last.name) +
                                       At(last.site) + ", " + Seconds(last.age_seconds) + " ago)");
    }
    for (const auto& [ranks, text] : Runs(absent)) os << ranks << text << ";";
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
