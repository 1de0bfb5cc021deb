// The torch side of CUDA stream ordering: ready events on the current stream (docs/architecture.md).
//
//   enqueue   MarkCallerStream records an event on the caller's current stream: the op's ready
//             event. horovodlite's stream waits for it (device-side) before reading the inputs.
//   allocate  AllocateAfter allocates an output (allgather, alltoall, reducescatter) on the
//             caller's stream, so the caching allocator orders its reuse there, and re-records the
//             ready event: memory freed by the caller after the enqueue may still be in use by
//             work queued since, and horovodlite's stream must wait for that work too.
//   wait      WaitOnCallerStream makes the caller's current stream wait for the event horovodlite
//             recorded after the op, before the caller uses the outputs. No call synchronises a
//             whole device.
//
// CUDA builds compile torch/cuda/stream_sync.cc; CPU-only builds compile torch/cpu/stream_sync.cc,
// where CUDA tensors never get past argument checking and these functions report that.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>

#include "common/device_event.h"
#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// Any thread: an event on the current stream of CUDA device `device`.
Status MarkCallerStream(int device, std::shared_ptr<DeviceEvent>* ready);

// Background thread: allocates `shape` with `options` (a CUDA device) on the stream `ready` was
// recorded on, then re-records `ready` there. `ready` must come from MarkCallerStream.
Status AllocateAfter(const std::shared_ptr<DeviceEvent>& ready, const Shape& shape,
                     const at::TensorOptions& options, at::Tensor* out);

// Caller's thread: the current stream of the event's device waits for `finished`.
Status WaitOnCallerStream(const std::shared_ptr<DeviceEvent>& finished);

}  // namespace hvdl
