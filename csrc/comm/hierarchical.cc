#include "comm/hierarchical.h"

#include <string>

namespace hvdl {

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

}  // namespace hvdl
