#include "backends/mpi/mpi_transport.h"

#include <climits>
#include <cstring>

#include <unistd.h>

#include "backends/mpi/mpi_util.h"
#include "comm/single_copy.h"
#include "common/logging.h"

namespace hvdl {
namespace {

// The data communicator carries no other point-to-point traffic.
constexpr int kRingTag = 7;        // plain messages (single copy off)
constexpr int kDescriptorTag = 8;  // single copy: descriptors, in posting order
constexpr int kAckTag = 9;         // single copy: "read it", receiver -> sender
constexpr int kDataTag = 10;       // single copy: data too scattered for a descriptor

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

}  // namespace

MpiTransport::MpiTransport(MPI_Comm comm, bool single_copy) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (single_copy && size_ > 1) ProbeSingleCopy();
}

// Collective. Decides per pair of members whether their ring messages go by single copy: only
// when both run on one host (one MPI_COMM_TYPE_SHARED node) and each could read the other's
// memory in the probe - a word at a known address holding a magic value and the owner's rank,
// so a read of another host's process (another PID namespace, the same pid number) or one the
// kernel forbids is detected, never trusted. Members on other hosts exchange MPI messages, and
// do not switch single copy off for the pairs that share a host. Only node members are probed
// and their verdicts shared (O(local size^2) words, not O(size^2)).
void MpiTransport::ProbeSingleCopy() {
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
          MPI_SUCCESS ||
      node == MPI_COMM_NULL) {
    return;
  }
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  probe_word_ = kProbeMagic | static_cast<uint64_t>(rank_);
  // Per node member: its rank in comm_, pid and probe address.
  uint64_t mine[3] = {static_cast<uint64_t>(rank_), static_cast<uint64_t>(getpid()),
                      static_cast<uint64_t>(reinterpret_cast<uintptr_t>(&probe_word_))};
  std::vector<uint64_t> members(3 * static_cast<size_t>(node_size));
  MPI_Allgather(mine, 3, MPI_UINT64_T, members.data(), 3, MPI_UINT64_T, node);
  // Step 1: can this rank read each node member's word?
  std::vector<uint8_t> readable(static_cast<size_t>(node_size), 0);
  for (int i = 0; SingleCopyBuilt() && i < node_size; ++i) {
    const uint64_t* m = &members[3 * static_cast<size_t>(i)];
    if (static_cast<int>(m[0]) == rank_) continue;
    uint64_t got = 0;
    void* there = reinterpret_cast<void*>(static_cast<uintptr_t>(m[2]));
    Status s = ReadFromProcess(static_cast<int64_t>(m[1]), {Span{&got, sizeof(got)}},
                               {Span{there, sizeof(got)}});
    readable[static_cast<size_t>(i)] = s.ok() && got == (kProbeMagic | m[0]) ? 1 : 0;
  }
  // Step 2: every member's verdicts; a pair uses single copy when both directions worked, so
  // that sender and receiver agree on how each message travels.
  std::vector<uint8_t> all(static_cast<size_t>(node_size) * static_cast<size_t>(node_size));
  MPI_Allgather(readable.data(), node_size, MPI_UINT8_T, all.data(), node_size, MPI_UINT8_T,
                node);
  int me = 0;
  MPI_Comm_rank(node, &me);
  MPI_Comm_free(&node);
  pids_.assign(static_cast<size_t>(size_), 0);
  peers_.assign(static_cast<size_t>(size_), 0);
  const size_t n = static_cast<size_t>(node_size);
  for (size_t i = 0; i < n; ++i) {
    const size_t rank = static_cast<size_t>(members[3 * i]);
    pids_[rank] = static_cast<int64_t>(members[3 * i + 1]);
    peers_[rank] = all[static_cast<size_t>(me) * n + i] && all[i * n + static_cast<size_t>(me)];
    single_copy_peers_ += peers_[rank];
  }
  HVDL_LOG(Debug) << "ring transport over " << size_ << " ranks: single copy with "
                  << single_copy_peers_ << " of " << node_size - 1 << " members on this host";
}

MpiTransport::Request& MpiTransport::NewRequest(int peer, bool receive_descriptor, int* id) {
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
  return r;
}

Status MpiTransport::SpanType(const std::vector<Span>& spans, MPI_Datatype* type) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  for (const Span& s : spans) {
    if (s.count > INT_MAX) return Status::Internal("ring span larger than 2 GiB");
    MPI_Aint addr;
    HVDL_MPI(MPI_Get_address(s.data, &addr));
    lengths.push_back(static_cast<int>(s.count));
    addresses.push_back(addr);
  }
  HVDL_MPI(MPI_Type_create_hindexed(static_cast<int>(spans.size()), lengths.data(),
                                    addresses.data(), MPI_BYTE, type));
  HVDL_MPI(MPI_Type_commit(type));
  return Status::Ok();
}

// One span is a plain transfer; several become one message described by an hindexed datatype.
// The datatype is freed right after posting: MPI keeps it alive until the transfer completes.
Status MpiTransport::PostPlain(bool send, const std::vector<Span>& spans, int peer, int tag,
                               MPI_Request* req) {
  if (spans.size() == 1) {
    if (spans[0].count > INT_MAX) return Status::Internal("ring segment larger than 2 GiB");
    const int bytes = static_cast<int>(spans[0].count);
    if (send) {
      HVDL_MPI(MPI_Isend(spans[0].data, bytes, MPI_BYTE, peer, tag, comm_, req));
    } else {
      HVDL_MPI(MPI_Irecv(spans[0].data, bytes, MPI_BYTE, peer, tag, comm_, req));
    }
    return Status::Ok();
  }
  MPI_Datatype type;
  HVDL_RETURN_IF_ERROR(SpanType(spans, &type));
  int rc = send ? MPI_Isend(MPI_BOTTOM, 1, type, peer, tag, comm_, req)
                : MPI_Irecv(MPI_BOTTOM, 1, type, peer, tag, comm_, req);
  MPI_Type_free(&type);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, send ? "MPI_Isend (ring)" : "MPI_Irecv (ring)");
  return Status::Ok();
}

Status MpiTransport::PostSend(const std::vector<Span>& spans, int peer, int* request) {
  Request& r = NewRequest(peer, false, request);
  if (!single_copy(peer)) return PostPlain(true, spans, peer, kRingTag, &r.mpi);
  const uint64_t total = static_cast<uint64_t>(TotalCount(spans));
  std::vector<uint64_t>& d = r.descriptor;
  d.assign(kHeaderWords, 0);
  d[1] = total;
  d[2] = spans.size();
  if (total <= kInlineBytes) {
    d[0] = kInline;
    d.resize(kHeaderWords + (total + sizeof(uint64_t) - 1) / sizeof(uint64_t));
    char* p = reinterpret_cast<char*>(d.data() + kHeaderWords);
    for (const Span& s : spans) {
      std::memcpy(p, s.data, static_cast<size_t>(s.count));
      p += s.count;
    }
  } else if (spans.size() <= kMaxPieces) {
    d[0] = kRead;
    for (const Span& s : spans) {
      d.push_back(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(s.data)));
      d.push_back(static_cast<uint64_t>(s.count));
    }
    // The acknowledgement's receive is posted before the descriptor leaves, so the receiver's
    // blocking send of it always finds a match.
    HVDL_MPI(MPI_Irecv(nullptr, 0, MPI_BYTE, peer, kAckTag, comm_, &r.second));
  } else {
    d[0] = kSeparate;
    HVDL_RETURN_IF_ERROR(PostPlain(true, spans, peer, kDataTag, &r.second));
  }
  const int bytes = static_cast<int>(d.size() * sizeof(uint64_t));
  HVDL_MPI(MPI_Isend(d.data(), bytes, MPI_BYTE, peer, kDescriptorTag, comm_, &r.mpi));
  return Status::Ok();
}

Status MpiTransport::PostRecv(const std::vector<Span>& spans, int peer, int* request) {
  Request& r = NewRequest(peer, single_copy(peer), request);
  if (!single_copy(peer)) return PostPlain(false, spans, peer, kRingTag, &r.mpi);
  r.local = spans;
  r.descriptor.resize(kDescriptorWords);
  HVDL_MPI(MPI_Irecv(r.descriptor.data(), static_cast<int>(kDescriptorWords * sizeof(uint64_t)),
                     MPI_BYTE, peer, kDescriptorTag, comm_, &r.mpi));
  return Status::Ok();
}

// The ring waits for its receives in posting order, so descriptors are consumed, and
// acknowledgements sent, in the order the sender posted them.
Status MpiTransport::CompleteReceive(Request* r) {
  HVDL_MPI(MPI_Wait(&r->mpi, MPI_STATUS_IGNORE));
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
      for (uint64_t i = 0; i < d[2]; ++i) {
        remote.push_back({reinterpret_cast<void*>(static_cast<uintptr_t>(d[kHeaderWords + 2 * i])),
                          static_cast<int64_t>(d[kHeaderWords + 2 * i + 1])});
      }
      HVDL_RETURN_IF_ERROR(ReadFromProcess(pids_[static_cast<size_t>(r->peer)], r->local, remote));
      HVDL_MPI(MPI_Send(nullptr, 0, MPI_BYTE, r->peer, kAckTag, comm_));
      return Status::Ok();
    }
    case kSeparate: {
      MPI_Request req;
      HVDL_RETURN_IF_ERROR(PostPlain(false, r->local, r->peer, kDataTag, &req));
      HVDL_MPI(MPI_Wait(&req, MPI_STATUS_IGNORE));
      return Status::Ok();
    }
    default:
      return Status::Internal("corrupt ring descriptor from rank " + std::to_string(r->peer));
  }
}

Status MpiTransport::Isend(const void* buf, size_t bytes, int peer, int* request) {
  return PostSend({Span{const_cast<void*>(buf), static_cast<int64_t>(bytes)}}, peer, request);
}

Status MpiTransport::Irecv(void* buf, size_t bytes, int peer, int* request) {
  return PostRecv({Span{buf, static_cast<int64_t>(bytes)}}, peer, request);
}

Status MpiTransport::IsendSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                int* request) {
  return PostSend(InBytes(spans, esize), peer, request);
}

Status MpiTransport::IrecvSpans(const std::vector<Span>& spans, size_t esize, int peer,
                                int* request) {
  return PostRecv(InBytes(spans, esize), peer, request);
}

Status MpiTransport::Wait(int request) {
  Request& r = requests_[static_cast<size_t>(request)];
  Status s;
  if (r.receive_descriptor) {
    s = CompleteReceive(&r);
  } else {
    MPI_Request both[2] = {r.mpi, r.second};
    int rc = MPI_Waitall(2, both, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) s = MpiStatus(rc, "MPI_Waitall (ring)");
  }
  r.mpi = MPI_REQUEST_NULL;
  r.second = MPI_REQUEST_NULL;
  r.local.clear();
  free_.push_back(request);
  return s;
}

}  // namespace hvdl
