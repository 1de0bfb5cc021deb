#include "comm/single_copy_transport.h"

#include <cstring>

#include <unistd.h>

#include "comm/posted_requests.h"
#include "comm/single_copy.h"
#include "common/logging.h"

namespace hvdl {
namespace {

constexpr int kPlainTag = 0;       // peers without single copy
constexpr int kDescriptorTag = 1;  // descriptors, in posting order (and the probe)
constexpr int kAckTag = 2;         // "read it", receiver -> sender
constexpr int kDataTag = 3;        // data too scattered for a descriptor

// Descriptor: {kind, total bytes, pieces, then (address, length) per piece or inline bytes}.
enum Kind : uint64_t { kInline = 0, kRead = 1, kSeparate = 2 };
constexpr size_t kHeaderWords = 3;
constexpr size_t kMaxPieces = 256;  // well under IOV_MAX
constexpr size_t kDescriptorWords = kHeaderWords + 2 * kMaxPieces;
constexpr size_t kInlineBytes = (kDescriptorWords - kHeaderWords) * sizeof(uint64_t);
constexpr uint64_t kProbeMagic = 0x68766c6400000000ULL;

std::vector<Span> InBytes(const std::vector<Span>& spans, size_t esize) {
  std::vector<Span> out;
  out.reserve(spans.size());
  for (const Span& s : spans) out.push_back(Span{s.data, s.count * static_cast<int64_t>(esize)});
  return out;
}

// Posts receives from, then sends to, every peer in `peers` (tag 1), and waits for all:
// deadlock-free whatever order the peers run in.
Status Exchange(Transport* t, const std::vector<int>& peers, void* mine, size_t bytes,
                std::vector<char>* theirs) {
  theirs->assign(peers.size() * bytes, 0);
  PostedRequests posted(t);  // every request waited for on every path (transport.h)
  for (size_t i = 0; i < peers.size(); ++i) {
    const Span slot{theirs->data() + i * bytes, static_cast<int64_t>(bytes)};
    HVDL_RETURN_IF_ERROR(posted.Recv({slot}, 1, peers[i], kDescriptorTag));
  }
  for (int p : peers) {
    HVDL_RETURN_IF_ERROR(
        posted.Send({Span{mine, static_cast<int64_t>(bytes)}}, 1, p, kDescriptorTag));
  }
  return posted.WaitAll();
}

}  // namespace

SingleCopyTransport::SingleCopyTransport(std::unique_ptr<Transport> base,
                                         const std::vector<std::string>& hosts)
    : base_(std::move(base)),
      peers_(static_cast<size_t>(base_->size()), 0),
      pids_(static_cast<size_t>(base_->size()), 0) {
  if (base_->size() > 1) Probe(hosts);
}

// Collective. Decides per pair of members whether their messages go by single copy: only when
// both run on one host and each could read the other's memory in the probe - a word at a known
// address holding a magic value and the owner's rank, so a read of another host's process
// (another PID namespace, the same pid number) or one the kernel forbids is detected, never
// trusted. Members on other hosts exchange base messages, and do not switch single copy off for
// the pairs that share a host. Only members of this host are probed (O(local size) messages).
void SingleCopyTransport::Probe(const std::vector<std::string>& hosts) {
  const int me = rank();
  std::vector<int> same;
  for (int i = 0; i < size(); ++i) {
    if (i != me && hosts[static_cast<size_t>(i)] == hosts[static_cast<size_t>(me)]) {
      same.push_back(i);
    }
  }
  if (same.empty()) return;
  // Step 1: every host peer's pid and probe address.
  probe_word_ = kProbeMagic | static_cast<uint64_t>(me);
  uint64_t mine[2] = {static_cast<uint64_t>(getpid()),
                      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&probe_word_))};
  std::vector<char> theirs;
  Status s = Exchange(base_.get(), same, mine, sizeof(mine), &theirs);
  // Step 2: can this rank read each one's word?
  std::vector<uint8_t> readable(static_cast<size_t>(size()), 0);
  for (size_t i = 0; s.ok() && SingleCopyBuilt() && i < same.size(); ++i) {
    uint64_t m[2];
    std::memcpy(m, theirs.data() + i * sizeof(m), sizeof(m));
    uint64_t got = 0;
    void* there = reinterpret_cast<void*>(static_cast<uintptr_t>(m[1]));
    Status r = ReadFromProcess(static_cast<int64_t>(m[0]), {Span{&got, sizeof(got)}},
                               {Span{there, sizeof(got)}});
    const size_t peer = static_cast<size_t>(same[i]);
    readable[peer] = r.ok() && got == (kProbeMagic | peer) ? 1 : 0;
    pids_[peer] = static_cast<int64_t>(m[0]);
  }
  // Step 3: every host peer's verdicts; a pair uses single copy when both directions worked,
  // so that sender and receiver agree on how each message travels.
  std::vector<char> verdicts;
  if (s.ok()) s = Exchange(base_.get(), same, readable.data(), readable.size(), &verdicts);
  for (size_t i = 0; s.ok() && i < same.size(); ++i) {
    const size_t peer = static_cast<size_t>(same[i]);
    const bool both = readable[peer] && verdicts[i * readable.size() + static_cast<size_t>(me)];
    peers_[peer] = both ? 1 : 0;
    single_copy_peers_ += both ? 1 : 0;
  }
  if (!s.ok()) {  // the members' messages will fail the same way; say why here once
    HVDL_LOG(Warning) << "single-copy probe failed (" << s.message() << "); messages only";
    std::fill(peers_.begin(), peers_.end(), 0);
    single_copy_peers_ = 0;
    return;
  }
  HVDL_LOG(Debug) << "transport over " << size() << " ranks: single copy with "
                  << single_copy_peers_ << " of " << same.size() << " members on this host";
}

SingleCopyTransport::Request& SingleCopyTransport::NewRequest(int peer, bool receive_descriptor,
                                                              int* id) {
  if (!free_.empty()) {
    *id = free_.back();
    free_.pop_back();
  } else {
    requests_.emplace_back();
    *id = static_cast<int>(requests_.size() - 1);
  }
  Request& r = requests_[static_cast<size_t>(*id)];
  r.peer = peer;
  r.receive_descriptor = receive_descriptor;
  r.first = r.second = -1;
  return r;
}

Status SingleCopyTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer,
                                     int tag, int* request) {
  if (tag != 0) return Status::Internal("single-copy transport: only tag 0 is offered");
  Request& r = NewRequest(peer, false, request);
  if (!single_copy(peer)) {
    return Posted(*request, base_->PostSend(spans, esize, peer, kPlainTag, &r.first));
  }
  const std::vector<Span> bytes = InBytes(spans, esize);
  const uint64_t total = static_cast<uint64_t>(TotalCount(bytes));
  std::vector<uint64_t>& d = r.descriptor;
  d.assign(kHeaderWords, 0);
  d[1] = total;
  d[2] = bytes.size();
  if (total <= kInlineBytes) {
    d[0] = kInline;
    d.resize(kHeaderWords + (total + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    char* p = reinterpret_cast<char*>(d.data() + kHeaderWords);
    for (const Span& s : bytes) {
      std::memcpy(p, s.data, static_cast<size_t>(s.count));
      p += s.count;
    }
  } else if (bytes.size() <= kMaxPieces) {
    d[0] = kRead;
    for (const Span& s : bytes) {
      d.push_back(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.data)));
      d.push_back(static_cast<uint64_t>(s.count));
    }
    // The acknowledgement's receive is posted before the descriptor leaves, so the receiver's
    // send of it always finds a match.
    HVDL_RETURN_IF_ERROR(Posted(*request, base_->PostRecv({}, 1, peer, kAckTag, &r.second)));
  } else {
    d[0] = kSeparate;
    HVDL_RETURN_IF_ERROR(Posted(*request, base_->PostSend(bytes, 1, peer, kDataTag, &r.second)));
  }
  return Posted(*request, base_->PostSend({Span{d.data(), static_cast<int64_t>(
                                                             d.size() * sizeof(uint64_t))}},
                                          1, peer, kDescriptorTag, &r.first));
}

// A post that failed leaves nothing posted (transport.h): the part of it already under way (the
// acknowledgement's receive, the separate data) is waited for, and the request released.
Status SingleCopyTransport::Posted(int id, Status s) {
  if (s.ok()) return s;
  Request& r = requests_[static_cast<size_t>(id)];
  if (r.second >= 0) {
    (void)base_->WaitUntil(r.second, std::chrono::steady_clock::now() +
                                         PostedRequests::drain_bound());
  }
  r.first = r.second = -1;
  r.local.clear();
  free_.push_back(id);
  return s;
}

Status SingleCopyTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer,
                                     int tag, int* request) {
  if (tag != 0) return Status::Internal("single-copy transport: only tag 0 is offered");
  Request& r = NewRequest(peer, single_copy(peer), request);
  if (!single_copy(peer)) {
    return Posted(*request, base_->PostRecv(spans, esize, peer, kPlainTag, &r.first));
  }
  r.local = InBytes(spans, esize);
  r.descriptor.resize(kDescriptorWords);
  return Posted(*request, base_->PostRecv({Span{r.descriptor.data(),
                                                static_cast<int64_t>(kDescriptorWords *
                                                                     sizeof(uint64_t))}},
                                          1, peer, kDescriptorTag, &r.first));
}

// Receives from one peer are waited for in posting order, so descriptors are consumed, and
// acknowledgements sent, in the order the sender posted them.
Status SingleCopyTransport::FinishReceive(Request* r) {
  const uint64_t* d = r->descriptor.data();
  const uint64_t total = d[1];
  if (total != static_cast<uint64_t>(TotalCount(r->local))) {
    return Status::Internal("ring message of " + std::to_string(total) + " bytes for a " +
                            std::to_string(TotalCount(r->local)) + "-byte destination from rank " +
                            std::to_string(r->peer));
  }
  switch (d[0]) {
    case kInline: {
      const char* p = reinterpret_cast<const char*>(d + kHeaderWords);
      for (const Span& s : r->local) {
        std::memcpy(s.data, p, static_cast<size_t>(s.count));
        p += s.count;
      }
      return Status::Ok();
    }
    case kRead: {
      std::vector<Span> remote;
      remote.reserve(d[2]);
      for (uint64_t i = 0; i < d[2]; ++i) {
        remote.push_back({reinterpret_cast<void*>(static_cast<uintptr_t>(d[kHeaderWords + 2 * i])),
                          static_cast<int64_t>(d[kHeaderWords + 2 * i + 1])});
      }
      HVDL_RETURN_IF_ERROR(ReadFromProcess(pids_[static_cast<size_t>(r->peer)], r->local, remote));
      int ack;
      HVDL_RETURN_IF_ERROR(base_->PostSend({}, 1, r->peer, kAckTag, &ack));
      return base_->Wait(ack);
    }
    case kSeparate: {
      int req;
      HVDL_RETURN_IF_ERROR(base_->PostRecv(r->local, 1, r->peer, kDataTag, &req));
      return base_->Wait(req);
    }
    default:
      return Status::Internal("corrupt ring descriptor from rank " + std::to_string(r->peer));
  }
}

bool SingleCopyTransport::Ready(int request) {
  const Request& r = requests_[static_cast<size_t>(request)];
  return base_->Ready(r.first) && (r.second < 0 || base_->Ready(r.second));
}

Status SingleCopyTransport::Wait(int request) {
  Request& r = requests_[static_cast<size_t>(request)];
  Status s = base_->Wait(r.first);
  // The acknowledgement's receive (or the separate data) is waited for even after a failed
  // descriptor (transport.h): the base transport has failed then, and fails the wait at once.
  if (!r.receive_descriptor && r.second >= 0) {
    Status second = base_->Wait(r.second);
    if (s.ok()) s = second;
  }
  return Finish(request, s);
}

// The same, each base request waited for until the deadline at most.
Status SingleCopyTransport::WaitUntil(int request, std::chrono::steady_clock::time_point deadline) {
  Request& r = requests_[static_cast<size_t>(request)];
  Status s = base_->WaitUntil(r.first, deadline);
  if (!r.receive_descriptor && r.second >= 0) {
    Status second = base_->WaitUntil(r.second, deadline);
    if (s.ok()) s = second;
  }
  return Finish(request, s);
}

Status SingleCopyTransport::Finish(int request, Status s) {
  Request& r = requests_[static_cast<size_t>(request)];
  if (s.ok() && r.receive_descriptor) s = FinishReceive(&r);
  r.local.clear();
  free_.push_back(request);
  return s;
}

}  // namespace hvdl
