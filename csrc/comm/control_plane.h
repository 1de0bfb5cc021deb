// ControlPlane: the communication the negotiation needs, and nothing else.
//
// Implemented over MPI (backends/mpi) and in-process over threads (comm/local_control_plane) so the
// controller can be unit-tested with N ranks in one process. Every method is called from the
// background thread only. Byte payloads are owned by the caller. Failures return a Status
// (kInternal) naming the call; nothing throws.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdl {

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Starts an in-place elementwise bitwise-OR allreduce of words[0, n). Non-blocking: returns once
  // posted. Exactly one may be outstanding; `words` must stay valid until TestBitwiseOr reports
  // done, after which it holds the result on every rank.
  virtual Status StartBitwiseOr(uint64_t* words, size_t n) = 0;
  // Non-blocking progress check of the outstanding StartBitwiseOr.
  virtual Status TestBitwiseOr(bool* done) = 0;

  // Blocking. Every rank contributes `send`; on rank 0 `recv` receives all contributions indexed by
  // rank (elsewhere it is left empty).
  virtual Status Gather(const std::string& send, std::vector<std::string>* recv) = 0;
  // Blocking. Rank 0's `data` replaces `data` on every other rank.
  virtual Status Broadcast(std::string* data) = 0;
};

}  // namespace hvdl
