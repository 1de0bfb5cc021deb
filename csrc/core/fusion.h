// Fusion: which agreed responses run as one collective, and the buffer they are packed into.
//
// PlanBatches is a pure function of the agreed response list and the threshold, so every rank
// derives the same plan without communicating, and the plan never depends on one rank's timing.
// Allreduces (and allgathers, reducescatters) that share op, dtype, scale factors, device and
// process set are packed, in list order, into batches of at most `threshold` bytes; a tensor
// larger than the threshold runs alone, in place, without the buffer. Other ops run alone.
// Batches execute in the order of their first response.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/message.h"

namespace hvdl {

struct Batch {
  std::vector<size_t> members;  // indices into the response list, in list order
  int64_t bytes = 0;
};

// `bytes[i]` is response i's payload size for fusion purposes.
std::vector<Batch> PlanBatches(const std::vector<const Response*>& responses, int64_t threshold,
                               const std::vector<int64_t>& bytes);

// The persistent fusion buffer: grows to the largest batch once and is reused every cycle.
class FusionBuffer {
 public:
  // Returns a buffer of at least `bytes` (64-byte aligned; huge-page backed from 2 MiB), or
  // nullptr if memory is exhausted; contents are unspecified.
  void* Reserve(size_t bytes);
  size_t capacity() const { return capacity_; }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t capacity_ = 0;
};

}  // namespace hvdl
