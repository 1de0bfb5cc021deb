#include "comm/ring.h"

#include <algorithm>
#include <vector>

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
  DataType dtype;
  ReduceOp op;
  size_t seg_elems;
  std::vector<char>* scratch;  // two slots of seg_elems elements
  RingStats* stats;
};

// Folds a received message (contiguous in `slot`) into the spans it belongs to.
void ReduceMessage(const Message& m, const char* slot, DataType dtype, ReduceOp op) {
  const size_t esize = DataTypeSize(dtype);
  for (const Span& s : m.spans) {
    ReduceInto(s.data, slot, s.count, dtype, op);
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
  std::vector<int> sends;
  std::vector<int> recvs(nr, -1);
  auto post = [&](size_t j) -> Status {
    if (j < nr) {
      const Message& m = (*a.recv)[j];
      if (a.reduce) {
        HVDL_RETURN_IF_ERROR(
            a.t->Irecv(slot(j), static_cast<size_t>(m.count) * esize, left, &recvs[j]));
      } else {
        HVDL_RETURN_IF_ERROR(a.t->IrecvSpans(m.spans, esize, left, &recvs[j]));
      }
    }
    if (j < ns) {
      const Message& m = (*a.send)[j];
      int req;
      HVDL_RETURN_IF_ERROR(a.t->IsendSpans(m.spans, esize, right, &req));
      sends.push_back(req);
      a.stats->bytes_sent += m.count * static_cast<int64_t>(esize);
    }
    return Status::Ok();
  };
  const size_t steps = std::max(ns, nr);
  if (steps > 0) HVDL_RETURN_IF_ERROR(post(0));
  for (size_t j = 0; j < steps; ++j) {
    if (j < nr) HVDL_RETURN_IF_ERROR(a.t->Wait(recvs[j]));
    // Step 1: get message j+1 moving before touching message j (its slot is free again:
    // message j-1 was reduced in the previous iteration).
    if (j + 1 < steps) HVDL_RETURN_IF_ERROR(post(j + 1));
    // Step 2: fold the received message j into the local chunk.
    if (a.reduce && j < nr) ReduceMessage((*a.recv)[j], slot(j), a.dtype, a.op);
  }
  for (int req : sends) HVDL_RETURN_IF_ERROR(a.t->Wait(req));
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

Status RingAllreduce(Transport* t, const std::vector<std::vector<Span>>& chunks, DataType dtype,
                     ReduceOp op, double postscale, size_t segment_bytes, RingStats* stats) {
  RingStats local;
  if (stats == nullptr) stats = &local;
  const int n = t->size();
  const int r = t->rank();
  if (static_cast<int>(chunks.size()) != n) {
    return Status::Internal("ring allreduce: " + std::to_string(chunks.size()) + " chunks for " +
                            std::to_string(n) + " ranks");
  }
  const size_t esize = DataTypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, segment_bytes / esize);
  std::vector<std::vector<Message>> pieces;
  for (const auto& c : chunks) {
    pieces.push_back(Messages(c, static_cast<int64_t>(seg_elems), esize));
  }
  std::vector<char> scratch(2 * seg_elems * esize);
  StepArgs a{t, nullptr, nullptr, true, dtype, op, seg_elems, &scratch, stats};
  for (int s = 0; s < n - 1; ++s) {
    a.send = &pieces[static_cast<size_t>(Mod(r - s, n))];
    a.recv = &pieces[static_cast<size_t>(Mod(r - s - 1, n))];
    HVDL_RETURN_IF_ERROR(RingStep(a));
  }
  if (postscale != 1.0) {
    for (const Span& sp : chunks[static_cast<size_t>(Mod(r + 1, n))]) {
      Scale(sp.data, sp.count, dtype, postscale);
    }
  }
  a.reduce = false;
  for (int s = 0; s < n - 1; ++s) {
    a.send = &pieces[static_cast<size_t>(Mod(r + 1 - s, n))];
    a.recv = &pieces[static_cast<size_t>(Mod(r - s, n))];
    HVDL_RETURN_IF_ERROR(RingStep(a));
  }
  return Status::Ok();
}

}  // namespace hvdl
