// TensorRef: the core's view of a framework tensor. It never owns memory; whoever enqueues it
// (the torch adapter) keeps the storage alive until the entry's callback has run.
#pragma once

#include <vector>

#include "common/types.h"

namespace hvdl {

struct TensorRef {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  Shape shape;
  int device = kCpuDevice;

  int64_t num_elements() const { return NumElements(shape); }
  size_t num_bytes() const { return static_cast<size_t>(num_elements()) * DataTypeSize(dtype); }
};

// A run of `count` elements at `data`: a piece of a (possibly fused) collective buffer that lives
// inside some tensor. Lists of spans let collectives work on tensors in place, without packing.
struct Span {
  void* data = nullptr;
  int64_t count = 0;
};

inline int64_t TotalCount(const std::vector<Span>& spans) {
  int64_t n = 0;
  for (const Span& s : spans) n += s.count;
  return n;
}

}  // namespace hvdl
