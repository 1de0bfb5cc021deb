#include "comm/transport_collectives.h"

#include <cstring>
#include <string>

#include "comm/posted_requests.h"
#include "comm/ring.h"

namespace hvdl {
namespace {

// memcpy with a zero size may get a null pointer (an empty vector's data(), an empty tensor's
// buffer), which memcpy's contract forbids (UBSan's nonnull-attribute): copy only bytes.
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> out(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) out[i] = out[i - 1] + counts[i - 1];
  return out;
}

// The ring's chunk list over member-ordered blocks of `base`: the ring completes chunk
// RingOwnedChunk(r, n) = r + 1 at member r, so chunk (i + 1) mod n is block i.
std::vector<std::vector<Span>> BlocksAsChunks(void* base, const std::vector<int64_t>& counts,
                                              DataType dtype) {
  const size_t n = counts.size();
  const std::vector<int64_t> at = Offsets(counts);
  const size_t esize = DataTypeSize(dtype);
  std::vector<std::vector<Span>> chunks(n);
  for (size_t i = 0; i < n; ++i) {
    chunks[(i + 1) % n] = {Span{static_cast<char*>(base) + at[i] * static_cast<int64_t>(esize),
                                counts[i]}};
  }
  return chunks;
}

Status CheckCounts(const Transport* t, size_t counts, const char* what) {
  if (static_cast<int>(counts) == t->size()) return Status::Ok();
  return Status::Internal(std::string(what) + ": " + std::to_string(counts) + " counts for " +
                          std::to_string(t->size()) + " members");
}

}  // namespace

Status TransportAllgatherv(Transport* t, const void* send, void* recv,
                           const std::vector<int64_t>& counts, DataType dtype,
                           size_t segment_bytes) {
  HVDL_RETURN_IF_ERROR(CheckCounts(t, counts.size(), "allgather"));
  const size_t esize = DataTypeSize(dtype);
  const int me = t->rank();
  if (send != nullptr) {
    CopyBytes(static_cast<char*>(recv) + Offsets(counts)[static_cast<size_t>(me)] * esize, send,
                static_cast<size_t>(counts[static_cast<size_t>(me)]) * esize);
  }
  if (t->size() == 1) return Status::Ok();
  return RingAllgather(t, BlocksAsChunks(recv, counts, dtype), dtype, segment_bytes, nullptr);
}

Status TransportReduceScatter(Transport* t, const void* send, void* recv,
                              const std::vector<int64_t>& counts, DataType dtype, ReduceOp op,
                              size_t segment_bytes) {
  HVDL_RETURN_IF_ERROR(CheckCounts(t, counts.size(), "reducescatter"));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  // The ring reduces in place: on a copy, since `send` is the caller's.
  thread_local std::vector<char> work;
  work.resize(static_cast<size_t>(total) * DataTypeSize(dtype));
  CopyBytes(work.data(), send, work.size());
  return TransportReduceScatterInPlace(t, work.data(), recv, counts, dtype, op, segment_bytes);
}

Status TransportReduceScatterInPlace(Transport* t, void* work, void* recv,
                                     const std::vector<int64_t>& counts, DataType dtype,
                                     ReduceOp op, size_t segment_bytes) {
  HVDL_RETURN_IF_ERROR(CheckCounts(t, counts.size(), "reducescatter"));
  const size_t esize = DataTypeSize(dtype);
  if (t->size() > 1) {
    HVDL_RETURN_IF_ERROR(RingReduceScatter(t, BlocksAsChunks(work, counts, dtype), dtype, op,
                                           segment_bytes, nullptr));
  }
  const size_t me = static_cast<size_t>(t->rank());
  const char* mine =
      static_cast<const char*>(work) + Offsets(counts)[me] * static_cast<int64_t>(esize);
  if (mine != recv) CopyBytes(recv, mine, static_cast<size_t>(counts[me]) * esize);
  return Status::Ok();
}

// Binomial tree over ranks relative to the root (v = 0 is the root): member v receives from
// v - m, m its lowest set bit, then sends to v + m' for each smaller power of two m'.
Status TransportBroadcast(Transport* t, void* buf, int64_t count, DataType dtype, int root) {
  const int n = t->size();
  if (n == 1) return Status::Ok();
  const size_t bytes = static_cast<size_t>(count) * DataTypeSize(dtype);
  const int v = (t->rank() - root + n) % n;
  PostedRequests posted(t);  // every request waited for on every path (transport.h)
  int mask = 1;
  while (mask < n) {
    if (v & mask) {
      int req = -1;
      HVDL_RETURN_IF_ERROR(posted.Recv(buf, bytes, (v - mask + root) % n, &req));
      HVDL_RETURN_IF_ERROR(posted.Wait(req));
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) HVDL_RETURN_IF_ERROR(posted.Send(buf, bytes, (v + mask + root) % n));
  }
  return posted.WaitAll();
}

Status TransportAlltoallv(Transport* t, const void* send, const std::vector<int64_t>& send_counts,
                          void* recv, const std::vector<int64_t>& recv_counts, DataType dtype) {
  HVDL_RETURN_IF_ERROR(CheckCounts(t, send_counts.size(), "alltoall"));
  HVDL_RETURN_IF_ERROR(CheckCounts(t, recv_counts.size(), "alltoall"));
  const int n = t->size(), me = t->rank();
  const size_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> sat = Offsets(send_counts), rat = Offsets(recv_counts);
  auto at = [](const std::vector<int64_t>& v, int m) { return v[static_cast<size_t>(m)]; };
  char* out = static_cast<char*>(recv);
  char* in = static_cast<char*>(const_cast<void*>(send));
  PostedRequests posted(t);  // every request waited for on every path (transport.h)
  // Step 1: every receive, from the member s behind, s = 1..n-1.
  for (int s = 1; s < n; ++s) {
    const int from = (me - s + n) % n;
    HVDL_RETURN_IF_ERROR(posted.Recv(out + at(rat, from) * static_cast<int64_t>(esize),
                                     static_cast<size_t>(at(recv_counts, from)) * esize, from));
  }
  // Step 2: every send, to the member s ahead (each pair's two messages cross once).
  for (int s = 1; s < n; ++s) {
    const int to = (me + s) % n;
    HVDL_RETURN_IF_ERROR(posted.Send(in + at(sat, to) * static_cast<int64_t>(esize),
                                     static_cast<size_t>(at(send_counts, to)) * esize, to));
  }
  // Step 3: this rank's own block, while the messages travel.
  if (at(send_counts, me) > 0) {
    std::memmove(out + at(rat, me) * static_cast<int64_t>(esize),
                 in + at(sat, me) * static_cast<int64_t>(esize),
                 static_cast<size_t>(at(send_counts, me)) * esize);
  }
  return posted.WaitAll();
}

}  // namespace hvdl
