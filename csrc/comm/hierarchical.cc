#include "comm/hierarchical.h"

#include <cstring>
#include <string>

namespace hvdl {
namespace {

// memcpy with a zero size may get a null pointer (an empty vector's data(), an empty tensor's
// buffer), which memcpy's contract forbids (UBSan's nonnull-attribute): copy only bytes.
void CopyBytes(void* dst, const void* src, size_t n) {
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace

Status HierarchicalAllreduce(Transport* local, Transport* cross,
                             const std::vector<std::vector<Span>>& chunks, DataType dtype,
                             ReduceOp op, double postscale, size_t local_segment_bytes,
                             size_t cross_segment_bytes, RingStats* stats,
                             const std::function<void(const char*)>& phase) {
  const auto stage = [&](const char* name) {
    if (phase) phase(name);
  };
  const size_t L = static_cast<size_t>(local->size());
  const size_t C = static_cast<size_t>(cross->size());
  if (chunks.size() != L * C) {
    return Status::Internal("hierarchical allreduce: " + std::to_string(chunks.size()) +
                            " chunks for " + std::to_string(L) + " local x " +
                            std::to_string(C) + " cross ranks");
  }
  std::vector<std::vector<Span>> super(L);
  for (size_t j = 0; j < L; ++j) {
    for (size_t k = 0; k < C; ++k) {
      const auto& c = chunks[j * C + k];
      super[j].insert(super[j].end(), c.begin(), c.end());
    }
  }
  stage("LOCAL_REDUCESCATTER");
  HVDL_RETURN_IF_ERROR(
      RingReduceScatter(local, super, dtype, op, local_segment_bytes, stats));
  const size_t owned = static_cast<size_t>(RingOwnedChunk(local->rank(), local->size()));
  const std::vector<std::vector<Span>> mine(chunks.begin() + static_cast<long>(owned * C),
                                            chunks.begin() + static_cast<long>(owned * C + C));
  stage("CROSS_ALLREDUCE");
  HVDL_RETURN_IF_ERROR(
      RingAllreduce(cross, mine, dtype, op, postscale, cross_segment_bytes, stats));
  stage("LOCAL_ALLGATHER");
  return RingAllgather(local, super, dtype, local_segment_bytes, stats);
}

namespace {

// The gathers' layout: `columns` must be L columns of C ranks and `counts` one per rank; `at`
// gets each rank's block offset (elements).
Status BlockLayout(const char* what, size_t L, size_t C, size_t me_local,
                   const std::vector<std::vector<int>>& columns,
                   const std::vector<int64_t>& counts, std::vector<int64_t>* at) {
  if (columns.size() != L || columns[me_local].size() != C || counts.size() != L * C) {
    return Status::Internal(std::string("hierarchical ") + what + ": a layout of " +
                            std::to_string(columns.size()) + " columns and " +
                            std::to_string(counts.size()) + " counts for " + std::to_string(L) +
                            " local x " + std::to_string(C) + " cross ranks");
  }
  at->assign(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) (*at)[i] = (*at)[i - 1] + counts[i - 1];
  return Status::Ok();
}

}  // namespace

Status HierarchicalAllgatherv(Transport* local, Transport* cross, const void* send, void* recv,
                              const std::vector<int64_t>& counts, DataType dtype,
                              const std::vector<std::vector<int>>& columns,
                              size_t local_segment_bytes, size_t cross_segment_bytes) {
  const size_t L = static_cast<size_t>(local->size());
  const size_t C = static_cast<size_t>(cross->size());
  const size_t me_local = static_cast<size_t>(local->rank());
  std::vector<int64_t> at;
  HVDL_RETURN_IF_ERROR(BlockLayout("allgather", L, C, me_local, columns, counts, &at));
  const size_t esize = DataTypeSize(dtype);
  const auto block = [&](int rank) {
    const size_t r = static_cast<size_t>(rank);
    return Span{static_cast<char*>(recv) + at[r] * static_cast<int64_t>(esize), counts[r]};
  };
  const int me = columns[me_local][static_cast<size_t>(cross->rank())];
  if (send != nullptr) {
    CopyBytes(block(me).data, send, static_cast<size_t>(counts[static_cast<size_t>(me)]) * esize);
  }
  // The ring completes chunk RingOwnedChunk(m, n) = m + 1 at member m: chunk (m + 1) mod n is
  // what member m brings.
  if (C > 1) {
    std::vector<std::vector<Span>> chunks(C);
    for (size_t h = 0; h < C; ++h) chunks[(h + 1) % C] = {block(columns[me_local][h])};
    HVDL_RETURN_IF_ERROR(RingAllgather(cross, chunks, dtype, cross_segment_bytes, nullptr));
  }
  if (L > 1) {
    std::vector<std::vector<Span>> chunks(L);
    for (size_t l = 0; l < L; ++l) {
      for (int rank : columns[l]) chunks[(l + 1) % L].push_back(block(rank));
    }
    HVDL_RETURN_IF_ERROR(RingAllgather(local, chunks, dtype, local_segment_bytes, nullptr));
  }
  return Status::Ok();
}

Status HierarchicalReduceScatter(Transport* local, Transport* cross, const void* send, void* recv,
                                 const std::vector<int64_t>& counts, DataType dtype, ReduceOp op,
                                 const std::vector<std::vector<int>>& columns,
                                 size_t local_segment_bytes, size_t cross_segment_bytes) {
  const size_t L = static_cast<size_t>(local->size());
  const size_t C = static_cast<size_t>(cross->size());
  const size_t me_local = static_cast<size_t>(local->rank());
  std::vector<int64_t> at;
  HVDL_RETURN_IF_ERROR(BlockLayout("reducescatter", L, C, me_local, columns, counts, &at));
  const size_t esize = DataTypeSize(dtype);
  // The rings reduce in place: on a copy, since `send` is the caller's.
  thread_local std::vector<char> work;
  work.resize(static_cast<size_t>(at.back() + counts.back()) * esize);
  CopyBytes(work.data(), send, work.size());
  const auto block = [&](int rank) {
    const size_t r = static_cast<size_t>(rank);
    return Span{work.data() + at[r] * static_cast<int64_t>(esize), counts[r]};
  };
  // The ring completes chunk RingOwnedChunk(m, n) = m + 1 at member m: chunk (m + 1) mod n is
  // what member m ends up with.
  if (L > 1) {
    std::vector<std::vector<Span>> chunks(L);
    for (size_t l = 0; l < L; ++l) {
      for (int rank : columns[l]) chunks[(l + 1) % L].push_back(block(rank));
    }
    HVDL_RETURN_IF_ERROR(
        RingReduceScatter(local, chunks, dtype, op, local_segment_bytes, nullptr));
  }
  if (C > 1) {
    std::vector<std::vector<Span>> chunks(C);
    for (size_t h = 0; h < C; ++h) chunks[(h + 1) % C] = {block(columns[me_local][h])};
    HVDL_RETURN_IF_ERROR(
        RingReduceScatter(cross, chunks, dtype, op, cross_segment_bytes, nullptr));
  }
  const int me = columns[me_local][static_cast<size_t>(cross->rank())];
  const Span mine = block(me);
  CopyBytes(recv, mine.data, static_cast<size_t>(mine.count) * esize);
  return Status::Ok();
}

}  // namespace hvdl
