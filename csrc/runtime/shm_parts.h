// ShmParts: what the ranks of one host use among themselves in a launch without MPI - the
// shared-memory transport (backends/shm, single copy of large messages on top when
// HOROVOD_RING_CMA allows) and the shared-memory control plane - handed to the Gloo world as its
// LocalParts. Segments are named `prefix-what` (the prefix names the job, its rendezvous round
// and the host). Cancel ends every wait of every group attached so far (Context::Abort).
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/gloo/gloo_world.h"
#include "backends/shm/shm_group.h"

namespace hvdl {

class ShmParts {
 public:
  ShmParts(std::string prefix, int rank, double timeout_seconds, bool single_copy);
  // LocalParts over this object, which must outlive them.
  LocalParts Parts();
  // Any thread.
  void Cancel(const std::string& why);

 private:
  Status Attach(const std::vector<int>& members, const std::string& what,
                ShmGroupOptions options, std::shared_ptr<ShmGroup>* out);

  std::string prefix_;
  int rank_;
  double timeout_seconds_;
  bool single_copy_;
  std::mutex mu_;  // guards groups_ (attached on the loop thread, cancelled from any)
  std::vector<std::weak_ptr<ShmGroup>> groups_;
};

}  // namespace hvdl
