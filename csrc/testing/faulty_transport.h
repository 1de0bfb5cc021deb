// FaultyTransport: a LocalTransport that counts the requests posted and not yet waited for, and
// fails on command - for tests of the rule every algorithm over a Transport keeps
// (comm/transport.h): nothing it posted is outstanding when it returns, on success or on error.
//
// One FaultPlan is shared by every transport of a test (the rank threads, their local and cross
// transports). At one global rank it fails that rank's `at`-th call (from 0) of a kind:
//   post   its `at`-th post returns an error, posting nothing;
//   wait   its `at`-th wait returns an error, the request released without receiving (final);
//   peer   the rank is lost at its `at`-th call (post or wait): that call and every later one of
//          it fail, and so do other ranks' posts to it and waits on requests with it.
// A transport that failed a call stays failed (later posts and waits fail at once; a wait still
// releases its request). The first failure also fails every mailbox of the test, so a wait that
// would block on a message that never comes fails instead - as a real transport's waits fail once
// its job lost a rank (a timeout, a cancel) - while messages already sent are still received.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "testing/local_transport.h"

namespace hvdl {

struct FaultPlan {
  enum class Kind { kNone, kPost, kWait, kPeer };
  Kind kind = Kind::kNone;
  int rank = -1;  // the global rank that fails
  int at = 0;     // which of its calls of that kind
  std::vector<std::shared_ptr<LocalMailboxes>> boxes;  // every mailbox of the test

  // The failing call, if this one (of `rank`; a post or a wait) is it: its error, and the
  // mailboxes failed. Thread-safe.
  Status Count(int rank, bool post);
  bool lost(int rank);
  int calls();  // the failing rank's calls of the plan's kind so far

 private:
  std::mutex mu_;
  int calls_ = 0;
  bool triggered_ = false;
};

class FaultyTransport : public Transport {
 public:
  // Member `member` of the mailboxes' group; `globals[m]`: member m's global rank.
  FaultyTransport(std::shared_ptr<LocalMailboxes> boxes, int member, std::vector<int> globals,
                  std::shared_ptr<FaultPlan> plan)
      : inner_(std::move(boxes), member), globals_(std::move(globals)), plan_(std::move(plan)) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;
  bool Ready(int request) override { return false; }

  // Posted and not yet waited for.
  size_t outstanding() const { return posted_.size(); }
  // Waits on requests that were not posted (or waited for twice).
  int misuse() const { return misuse_; }

 private:
  struct Posted {
    int inner;
    int peer;
  };
  Status Check(bool post, int peer);
  Status Remember(int inner, int peer, int* request);

  LocalTransport inner_;
  std::vector<int> globals_;
  std::shared_ptr<FaultPlan> plan_;
  std::map<int, Posted> posted_;
  int next_ = 0;
  int misuse_ = 0;
  Status failed_;
};

}  // namespace hvdl
