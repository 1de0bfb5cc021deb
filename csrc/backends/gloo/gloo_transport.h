// GlooTransport: the Transport over a c10d backend's point-to-point messages (torch's Gloo
// process group; TCP between hosts, Gloo's own pairs and threads).
//
// Members are a subset of the backend's ranks (`members[i]`: the backend rank of member i), so
// one process group carries the transports of every process set and of the hierarchical
// algorithms; `tag_base` keeps their messages apart (Gloo matches by peer and tag). A message of
// one span is sent from / received into the caller's memory; a message of several spans is packed
// into (unpacked from) a staging buffer, since a c10d message is one tensor. Gloo needs a receive
// of exactly the message's size (no larger), so this transport cannot carry single copy's
// descriptors: single copy runs over the shared-memory transport of one host instead.
// A wait gives up after the launch's timeout naming the peer (gloo_work.h). Background thread.
//
// Connections: the process group may hold several Gloo contexts (one per device it was made
// with: HOROVOD_GLOO_CONNECTIONS), each its own TCP connection per pair and its own loop
// thread; c10d sends a message of tag t on context t mod (contexts). With `connections` > 1 a
// message is cut into min(connections, bytes / kStripeBytes) contiguous stripes (at least one),
// stripe s on Gloo tag (tag_base + tag) * connections + s, so each travels its own connection.
// Both sides decide from the message's size, which they agree on (a Gloo receive has the
// message's exact size).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <string>
#include <vector>

#include "backends/gloo/gloo_work.h"
#include "comm/transport.h"

namespace hvdl {

class GlooTransport : public Transport {
 public:
  static constexpr int64_t kStripeBytes = 256 * 1024;

  // `names[i]`: how messages name member i ("rank 3 (host h1)"); `connections`: the group's
  // contexts to stripe messages over (1: none).
  GlooTransport(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> members, int rank,
                int tag_base, std::vector<std::string> names, GlooWaits* waits,
                int connections = 1);
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override;
  Status Wait(int request) override;
  // c10d's point-to-point work cannot be polled (its isCompleted is only set by wait): unknown,
  // so a routed transport keeps its other parts moving until they are done.
  bool Ready(int request) override { return false; }

 private:
  struct Request {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;  // one per stripe
    std::vector<char> staging;  // several spans: packed copy (send) / landing place (receive)
    std::vector<Span> unpack;   // receive of several spans: where the staging goes, in bytes
    std::string what;           // for messages
  };
  Status Post(bool send, const std::vector<Span>& spans, size_t esize, int peer, int tag,
              int* request);
  Request& NewRequest(int* id);

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::vector<int> members_;
  int rank_;
  int tag_base_;
  std::vector<std::string> names_;
  GlooWaits* waits_;
  int connections_;
  std::vector<Request> requests_;
  std::vector<int> free_;
};

}  // namespace hvdl
