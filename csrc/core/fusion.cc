#include "core/fusion.h"

#include <cstdlib>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace hvdl {
namespace {

bool Fusible(const Response& r) {
  return !r.is_error() &&
         (r.op == OpType::kAllreduce || r.op == OpType::kAllgather || r.op == OpType::kReducescatter);
}

bool SameKind(const Response& a, const Response& b) {
  return a.op == b.op && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         a.prescale == b.prescale && a.postscale == b.postscale && a.device == b.device &&
         a.process_set == b.process_set;
}

}  // namespace

std::vector<Batch> PlanBatches(const std::vector<const Response*>& responses, int64_t threshold,
                               const std::vector<int64_t>& bytes) {
  std::vector<Batch> batches;
  std::vector<size_t> open;  // index into `batches` of the batch still accepting members, per kind
  for (size_t i = 0; i < responses.size(); ++i) {
    const Response& r = *responses[i];
    if (!Fusible(r) || bytes[i] > threshold) {
      batches.push_back(Batch{{i}, bytes[i]});
      continue;
    }
    bool placed = false;
    for (size_t b : open) {
      Batch& batch = batches[b];
      if (SameKind(*responses[batch.members.front()], r) && batch.bytes + bytes[i] <= threshold) {
        batch.members.push_back(i);
        batch.bytes += bytes[i];
        placed = true;
        break;
      }
    }
    if (!placed) {
      // A full batch of this kind stops accepting members; the new one takes its place.
      for (size_t k = 0; k < open.size(); ++k) {
        if (SameKind(*responses[batches[open[k]].members.front()], r)) {
          open.erase(open.begin() + static_cast<long>(k));
          break;
        }
      }
      open.push_back(batches.size());
      batches.push_back(Batch{{i}, bytes[i]});
    }
  }
  return batches;
}

void FusionBuffer::Free::operator()(void* p) const { std::free(p); }

void* FusionBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_) return data_.get();
  // Huge pages (2 MiB aligned, madvise): MPI's shared-memory copies of the buffer run faster.
  constexpr size_t kHuge = 2u << 20;
  const size_t align = bytes >= kHuge ? kHuge : 64;
  size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  if (p == nullptr) return nullptr;
#if defined(__linux__)
  if (align == kHuge) madvise(p, rounded, MADV_HUGEPAGE);
#endif
  data_.reset(p);
  capacity_ = rounded;
  return p;
}

}  // namespace hvdl
