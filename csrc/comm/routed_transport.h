// RoutedTransport: one Transport over several, each carrying the messages of some members - e.g.
// shared memory (with single copy) to the members on this host and Gloo to the others - so the
// algorithms above see one group and never know which link a message takes.
//
// `routes[m]` says which part carries messages with member m and who m is there. Requests of
// the parts are renumbered (a part may use any ids, completed ones included). Ordering holds per
// part, which is all the contract asks: messages with one peer always take the same part.
// Progress: a part may move bytes only while its caller waits on it (shared memory streams a
// large message through its rings in Wait). So before blocking in one part's Wait, Wait keeps
// the other parts' posted requests moving (Transport::Progress) until they are done: otherwise
// a flat ring over shared memory and Gloo deadlocks - rank 0 blocked on Gloo from rank 3 never
// streams its message to rank 1, which rank 1 must pass on over Gloo before 3 can send.
// Background thread only, like every transport; the parts are owned.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "comm/transport.h"

namespace hvdl {

class RoutedTransport : public Transport {
 public:
  struct Route {
    int part = 0;  // index into the parts
    int peer = 0;  // the member's index within that part
  };
  RoutedTransport(std::vector<std::unique_ptr<Transport>> parts, std::vector<Route> routes,
                  int rank);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(routes_.size()); }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;
  Status WaitUntil(int request, std::chrono::steady_clock::time_point deadline) override;
  int single_copy_peers() const override;
  bool Progress() override;
  bool Ready(int request) override;

 private:
  int Remember(int part, int inner);
  // Releases our id and returns (its part, the part's id), once the other parts have moved
  // what they can (see Wait).
  std::pair<Transport*, int> Take(int request);

  std::vector<std::unique_ptr<Transport>> parts_;
  std::vector<Route> routes_;
  int rank_;
  std::vector<std::pair<int, int>> requests_;  // our id -> (part, its id)
  std::vector<int> free_;
};

}  // namespace hvdl
