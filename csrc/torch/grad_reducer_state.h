// GradReducer's per-parameter and per-bucket state, shared by grad_reducer.cc (the per-gradient
// path) and grad_buckets.cc (buckets). Private to those two files.
#pragma once

#include <c10/core/Stream.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <string>
#include <vector>

#include "torch/grad_reducer.h"

namespace hvdl {

// c10::intrusive_ptr<Node> from torch 2.10 on, std::shared_ptr<Node> before.
using Accumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<at::Tensor>()));

struct GradReducer::Param {
  at::Tensor tensor;
  Accumulator accumulator;  // kept alive: autograd holds it weakly, and our hook lives on it
  std::shared_ptr<AccumulatorSubscribers> subscribers;  // of our hook on `accumulator`
  bool active = true;       // false once Remove()d
  std::string name;        // the parameter's name, for errors
  std::string negotiated;  // the allreduce's name
  int remaining = 0;       // backward passes still to accumulate before the allreduce
  int handle = 0;          // the allreduce in flight (0: none)
  bool deferred = false;   // this step's gradient is Python's to launch
  bool sparse_seen = false;  // had a sparse gradient: Python's from then on
  int bucket = -1;           // its bucket (-1: none)
  at::Tensor view;           // its slice of the bucket, shaped as the parameter (undefined
                             // once the bucket released its flat tensor)
  bool bucket_ready = false;  // counted ready in its bucket this step
  bool own = false;           // this step reduced in a tensor of its own, not in its view
  bool sent = false;          // its gradient went out this step (here, not from Python) ...
  const void* sent_data = nullptr;  // ... from this memory: WaitAll checks p.grad is still it
  int64_t sent_version = 0;         // ... at this version: and that nothing changed it meanwhile
};

struct GradReducer::Bucket {
  at::Tensor flat;  // undefined once released (every member arrived in a tensor of its own)
  c10::Device device = c10::kCPU;  // where its members live
  at::ScalarType dtype = at::kFloat;
  int64_t bytes = 0;
  std::vector<int> members;
  std::string negotiated;
  std::string label;    // the bucket and its parameters, for errors
  int ready = 0;        // members ready this step
  int handle = 0;       // its allreduce in flight (0: none)
  bool broken = false;  // this step its members go out one by one
  int broken_at = -1;   // ... because of this member (position in `members`; the first one)
  std::vector<int> markers;  // handles of its markers in flight (bucket_agreement.cc)
  bool refused = false;  // the ranks disagreed: its members do not go out this step
  int copies = 0;       // gradients copied in this step
  int last_copies = 0;  // ... in the last step
  int own = 0;          // members reduced in tensors of their own this step
  int last_own = 0;     // ... in the last step
  int fallback_steps = 0;
  std::string fallback;
  // Device buckets: the streams its members became ready on this step (their hooks' current
  // streams, where autograd accumulated into the views), each once. The bucket's ready event is
  // recorded on one stream only; LaunchBucketLocked makes that stream wait for the others.
  std::vector<c10::Stream> streams;
};

// Device buckets: the current stream waits for the work queued so far on `streams` (those other
// than itself), then forgets them (grad_buckets.cc).
void WaitForStreams(const c10::Device& device, std::vector<c10::Stream>* streams);

}  // namespace hvdl
