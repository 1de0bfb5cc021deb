#include "comm/ring.h"

#include <algorithm>
#include <vector>

#include "comm/posted_requests.h"
#include "comm/reduce_kernels.h"

namespace hvdl {
namespace {

int Mod(int a, int n) { return ((a % n) + n) % n; }

// A chunk cut into messages of at most `seg` elements. A message may take pieces of several spans
// (it travels as one transfer over all of them); a span longer than `seg` is split.
struct Message {
  std::vector<Span> spans;
  int64_t count = 0;
};

std::vector<Message> Messages(const std::vector<Span>& spans, int64_t seg, size_t esize) {
  std::vector<Message> out;
  Message cur;
  for (const Span& s : spans) {
    for (int64_t off = 0; off < s.count;) {
      const int64_t take = std::min(seg - cur.count, s.count - off);
      cur.spans.push_back(Span{static_cast<char*>(s.data) + off * static_cast<int64_t>(esize),
                               take});
      cur.count += take;
      off += take;
      if (cur.count == seg) {
        out.push_back(std::move(cur));
        cur = Message();
      }
    }
  }
  if (cur.count > 0) out.push_back(std::move(cur));
  return out;
}

struct StepArgs {
  Transport* t;
  const std::vector<Message>* send;
  const std::vector<Message>* recv;
  bool reduce;  // reduce received messages into place (else receive in place)
  double postscale;  // multiply each reduced message by this while it is in cache (1: no)
  DataType dtype;
  ReduceOp op;
  size_t seg_elems;
  std::vector<char>* scratch;  // two slots of seg_elems elements
  RingStats* stats;
};

// Folds a received message (contiguous in `slot`) into the spans it belongs to, then scales them
// by `postscale` (1: not at all) while they are in cache: the same operations in the same order,
// so the same bits, without reading and writing the chunk once more (the separate pass was 6% of
// the background thread's CPU on an 8 MiB average at np 2). For float32/float64 Sum the fold and
// the scaling are one pass; that pass's saving is below what this VM can resolve (background
// thread CPU per MLP step 0.94-1.31 ms either way, alternating runs).
void ReduceMessage(const Message& m, const char* slot, DataType dtype, ReduceOp op,
                   double postscale) {
  const size_t esize = DataTypeSize(dtype);
  for (const Span& s : m.spans) {
    ReduceScaleInto(s.data, slot, s.count, dtype, op, postscale);
    slot += s.count * static_cast<int64_t>(esize);
  }
}

// One ring step: messages of `send` go right while messages of `recv` come from the left.
Status RingStep(const StepArgs& a) {
  const size_t esize = DataTypeSize(a.dtype);
  const int right = Mod(a.t->rank() + 1, a.t->size());
  const int left = Mod(a.t->rank() - 1, a.t->size());
  const size_t ns = a.send->size(), nr = a.recv->size();
  auto slot = [&](size_t j) -> char* {
    return a.scratch->data() + (j % 2) * a.seg_elems * esize;
  };
  // Every request posted below is waited for on every path (transport.h): a send that fails
  // after its step's receive was posted, or a failed wait, returns through `posted`, which
  // waits for what is still under way (the slots and spans stay valid: the caller's).
  PostedRequests posted(a.t);
  std::vector<int> recvs(nr, -1);
  auto post = [&](size_t j) -> Status {
    if (j < nr) {
      const Message& m = (*a.recv)[j];
      if (a.reduce) {
        HVDL_RETURN_IF_ERROR(
            posted.Recv(slot(j), static_cast<size_t>(m.count) * esize, left, &recvs[j]));
      } else {
        HVDL_RETURN_IF_ERROR(posted.Recv(m.spans, esize, left, 0, &recvs[j]));
      }
    }
    if (j < ns) {
      const Message& m = (*a.send)[j];
      HVDL_RETURN_IF_ERROR(posted.Send(m.spans, esize, right, 0));
      a.stats->bytes_sent += m.count * static_cast<int64_t>(esize);
    }
    return Status::Ok();
  };
  const size_t steps = std::max(ns, nr);
  if (steps > 0) HVDL_RETURN_IF_ERROR(post(0));
  for (size_t j = 0; j < steps; ++j) {
    if (j < nr) HVDL_RETURN_IF_ERROR(posted.Wait(recvs[j]));
    // Step 1: get message j+1 moving before touching message j (its slot is free again:
    // message j-1 was reduced in the previous iteration).
    if (j + 1 < steps) HVDL_RETURN_IF_ERROR(post(j + 1));
    // Step 2: fold the received message j into the local chunk.
    if (a.reduce && j < nr) ReduceMessage((*a.recv)[j], slot(j), a.dtype, a.op, a.postscale);
  }
  // Step 3: the sends (only they are left).
  HVDL_RETURN_IF_ERROR(posted.WaitAll());
  ++a.stats->steps;
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> EvenChunks(int64_t count, int n) {
  std::vector<int64_t> chunks(static_cast<size_t>(n), count / n);
  for (int64_t i = 0; i < count % n; ++i) ++chunks[static_cast<size_t>(i)];
  return chunks;
}

std::vector<std::vector<Span>> ContiguousChunks(void* buf, const std::vector<int64_t>& counts,
                                                DataType dtype) {
  std::vector<std::vector<Span>> chunks;
  char* p = static_cast<char*>(buf);
  for (int64_t c : counts) {
    chunks.push_back({Span{p, c}});
    p += c * static_cast<int64_t>(DataTypeSize(dtype));
  }
  return chunks;
}

int RingOwnedChunk(int rank, int n) { return Mod(rank + 1, n); }

namespace {

// Both phases: every chunk cut into its messages, and the two receive slots.
struct Phase {
  std::vector<std::vector<Message>> pieces;
  StepArgs args;
};

// The receive slots, kept from call to call by the thread that runs collectives: allocating
// (and zero-filling) 512 KiB per reduce-scatter cost a page-fault storm on every call.
std::vector<char>* Scratch(size_t bytes) {
  thread_local std::vector<char> scratch;
  if (scratch.size() < bytes) scratch.resize(bytes);
  return &scratch;
}

Status MakePhase(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                 ReduceOp op, size_t segment_bytes, RingStats* stats, bool reduce, Phase* p) {
  if (static_cast<int>(chunks.size()) != t->size()) {
    return Status::Internal("ring allreduce: " + std::to_string(chunks.size()) + " chunks for " +
                            std::to_string(t->size()) + " ranks");
  }
  const size_t esize = DataTypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, segment_bytes / esize);
  for (const auto& c : chunks) {
    p->pieces.push_back(Messages(c, static_cast<int64_t>(seg_elems), esize));
  }
  std::vector<char>* scratch = reduce ? Scratch(2 * seg_elems * esize) : nullptr;
  p->args = StepArgs{t, nullptr, nullptr, reduce, 1.0, dtype, op, seg_elems, scratch, stats};
  return Status::Ok();
}

}  // namespace

Status RingReduceScatter(Transport* t, const std::vector<std::vector<Span>>& chunks,
                         DataType dtype, ReduceOp op, size_t segment_bytes, RingStats* stats,
                         double postscale) {
  RingStats local;
  Phase p;
  HVDL_RETURN_IF_ERROR(MakePhase(t, chunks, dtype, op, segment_bytes,
                                 stats ? stats : &local, true, &p));
  const int n = t->size(), r = t->rank();
  for (int s = 0; s < n - 1; ++s) {
    p.args.send = &p.pieces[static_cast<size_t>(Mod(r - s, n))];
    p.args.recv = &p.pieces[static_cast<size_t>(Mod(r - s - 1, n))];
    p.args.postscale = s == n - 2 ? postscale : 1.0;  // the last step completes the owned chunk
    HVDL_RETURN_IF_ERROR(RingStep(p.args));
  }
  if (n == 1) ScaleSpans(chunks[0], dtype, postscale);
  return Status::Ok();
}

Status RingAllgather(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                     size_t segment_bytes, RingStats* stats) {
  RingStats local;
  Phase p;
  HVDL_RETURN_IF_ERROR(MakePhase(t, chunks, dtype, ReduceOp::kSum, segment_bytes,
                                 stats ? stats : &local, false, &p));
  const int n = t->size(), r = t->rank();
  for (int s = 0; s < n - 1; ++s) {
    p.args.send = &p.pieces[static_cast<size_t>(Mod(r + 1 - s, n))];
    p.args.recv = &p.pieces[static_cast<size_t>(Mod(r - s, n))];
    HVDL_RETURN_IF_ERROR(RingStep(p.args));
  }
  return Status::Ok();
}

void ScaleSpans(const std::vector<Span>& spans, DataType dtype, double factor) {
  if (factor == 1.0) return;
  for (const Span& sp : spans) Scale(sp.data, sp.count, dtype, factor);
}

Status RingAllreduce(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                     ReduceOp op, double postscale, size_t segment_bytes, RingStats* stats) {
  HVDL_RETURN_IF_ERROR(RingReduceScatter(t, chunks, dtype, op, segment_bytes, stats, postscale));
  return RingAllgather(t, chunks, dtype, segment_bytes, stats);
}

}  // namespace hvdl
