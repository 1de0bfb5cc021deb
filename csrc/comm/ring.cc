#include "comm/ring.h"

#include <algorithm>
#include <vector>

#include "comm/reduce_kernels.h"

namespace hvdl {
namespace {

struct RingLayout {
  std::vector<int64_t> count;
  std::vector<int64_t> offset;
};

RingLayout MakeLayout(const std::vector<int64_t>& chunks) {
  RingLayout l;
  l.count = chunks;
  int64_t off = 0;
  for (int64_t c : chunks) {
    l.offset.push_back(off);
    off += c;
  }
  return l;
}

int Mod(int a, int n) { return ((a % n) + n) % n; }

// One step: send chunk `send_c` to `right` while receiving chunk `recv_c` from `left`, segment by
// segment. With `reduce`, received segments land in a scratch buffer and are reduced into place;
// without, they are received in place.
Status RingStep(Transport* t, char* buf, const RingLayout& l, int send_c, int recv_c, bool reduce,
                DataType dtype, ReduceOp op, size_t seg_elems, std::vector<char>* scratch,
                RingStats* stats) {
  const size_t esize = DataTypeSize(dtype);
  const int right = Mod(t->rank() + 1, t->size());
  const int left = Mod(t->rank() - 1, t->size());
  const int64_t send_n = l.count[send_c];
  const int64_t recv_n = l.count[recv_c];
  const int64_t nseg = std::max<int64_t>((std::max(send_n, recv_n) + seg_elems - 1) / seg_elems, 1);
  auto seg_len = [&](int64_t total, int64_t j) {
    int64_t start = j * static_cast<int64_t>(seg_elems);
    return std::max<int64_t>(0, std::min<int64_t>(seg_elems, total - start));
  };
  auto recv_target = [&](int64_t j) -> char* {
    if (!reduce) return buf + (l.offset[recv_c] + j * static_cast<int64_t>(seg_elems)) * esize;
    return scratch->data() + static_cast<size_t>(j % 2) * seg_elems * esize;
  };
  std::vector<int> sends;
  int pending_recv = -1;
  auto post = [&](int64_t j) -> Status {
    int64_t sn = seg_len(send_n, j), rn = seg_len(recv_n, j);
    if (rn > 0) {
      HVDL_RETURN_IF_ERROR(t->Irecv(recv_target(j), static_cast<size_t>(rn) * esize, left,
                                    &pending_recv));
    } else {
      pending_recv = -1;
    }
    if (sn > 0) {
      int req;
      const char* src = buf + (l.offset[send_c] + j * static_cast<int64_t>(seg_elems)) * esize;
      HVDL_RETURN_IF_ERROR(t->Isend(src, static_cast<size_t>(sn) * esize, right, &req));
      sends.push_back(req);
      stats->bytes_sent += sn * static_cast<int64_t>(esize);
    }
    return Status::Ok();
  };
  HVDL_RETURN_IF_ERROR(post(0));
  for (int64_t j = 0; j < nseg; ++j) {
    int current = pending_recv;
    if (current >= 0) HVDL_RETURN_IF_ERROR(t->Wait(current));
    // Step 1: get segment j+1 moving before touching segment j.
    if (j + 1 < nseg) HVDL_RETURN_IF_ERROR(post(j + 1));
    // Step 2: fold the received segment j into the local chunk.
    int64_t rn = seg_len(recv_n, j);
    if (reduce && rn > 0) {
      char* dst = buf + (l.offset[recv_c] + j * static_cast<int64_t>(seg_elems)) * esize;
      ReduceInto(dst, recv_target(j), rn, dtype, op);
    }
  }
  for (int req : sends) HVDL_RETURN_IF_ERROR(t->Wait(req));
  ++stats->steps;
  return Status::Ok();
}

}  // namespace

std::vector<int64_t> EvenChunks(int64_t count, int n) {
  std::vector<int64_t> chunks(static_cast<size_t>(n), count / n);
  for (int64_t i = 0; i < count % n; ++i) ++chunks[static_cast<size_t>(i)];
  return chunks;
}

Status RingAllreduce(Transport* t, void* data, const std::vector<int64_t>& chunks, DataType dtype,
                     ReduceOp op, double postscale, size_t segment_bytes, RingStats* stats) {
  RingStats local;
  if (stats == nullptr) stats = &local;
  const int n = t->size();
  const int r = t->rank();
  if (static_cast<int>(chunks.size()) != n) {
    return Status::Internal("ring allreduce: " + std::to_string(chunks.size()) +
                            " chunks for " + std::to_string(n) + " ranks");
  }
  char* buf = static_cast<char*>(data);
  RingLayout l = MakeLayout(chunks);
  const size_t esize = DataTypeSize(dtype);
  const size_t seg_elems = std::max<size_t>(1, segment_bytes / esize);
  std::vector<char> scratch(2 * seg_elems * esize);
  for (int s = 0; s < n - 1; ++s) {
    HVDL_RETURN_IF_ERROR(RingStep(t, buf, l, Mod(r - s, n), Mod(r - s - 1, n), true, dtype, op,
                                  seg_elems, &scratch, stats));
  }
  const int owned = Mod(r + 1, n);
  if (postscale != 1.0) Scale(buf + l.offset[owned] * esize, l.count[owned], dtype, postscale);
  for (int s = 0; s < n - 1; ++s) {
    HVDL_RETURN_IF_ERROR(RingStep(t, buf, l, Mod(r + 1 - s, n), Mod(r - s, n), false, dtype, op,
                                  seg_elems, &scratch, stats));
  }
  return Status::Ok();
}

}  // namespace hvdl
