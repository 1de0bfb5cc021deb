// BatchOps: the per-op code of the executor - allreduce, allgather, reducescatter, broadcast,
// alltoall - written once for host and device memory (core/batch_memory says how bytes move).
//
// For one planned batch (same op, dtype, scale factors, process set, device; core/fusion):
//   allreduce      asks the planner (comm/allreduce_planner) how; a lone tensor is reduced in
//                  place on its output; a fused batch on a ring plan is reduced where its tensors
//                  are, as chunk-major spans (host memory); with one member there is nothing to
//                  exchange and each tensor is scaled where it is; otherwise the tensors are
//                  packed (prescale applied while packing) into the fusion buffer, reduced, and
//                  unpacked. A rank that joined contributes zeros for the tensors it lacks.
//   allgather      member-major fusion buffer (core/collective_layout), outputs allocated once
//                  the sizes are agreed; a lone tensor gathers straight into its output.
//   reducescatter  packed member-major with the prescale, reduced, unpacked with the postscale.
//   broadcast      in place on the output (the root copies its input there first).
//   alltoall       straight from the input into the allocated output.
// Layouts are the same in both memories; only the byte movers differ. Background thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/allreduce_planner.h"
#include "comm/backend_registry.h"
#include "core/batch_memory.h"
#include "core/process_set.h"

namespace hvdl {

class BatchOps {
 public:
  // Names the phase the batch enters, for the timeline (static strings).
  using Phase = std::function<void(const char* activity)>;

  // None is owned; all must outlive this object.
  BatchOps(ProcessSetTable* sets, const AllreducePlanner* planner, const BackendRegistry* registry,
           int rank)
      : sets_(sets), planner_(planner), registry_(registry), rank_(rank) {}

  // Runs one batch of a data op in `memory`. *be: the backend it ran on (null if none was
  // chosen). `extra` receives alltoall's received splits.
  Status Run(BatchItems& items, BatchMemory* memory, const Phase& phase, DataBackend** be,
             std::vector<int64_t>* extra);

 private:
  Status Allreduce(BatchItems& items, BatchMemory* m, const Phase& phase, DataBackend** be);
  Status FusedRing(BatchItems& items, BatchMemory* m, const AllreducePlan& plan,
                   AllreduceArgs* args, const std::vector<int64_t>& counts, int n,
                   const Phase& phase);
  Status Allgather(BatchItems& items, BatchMemory* m, DataBackend* be, const Phase& phase);
  Status Reducescatter(BatchItems& items, BatchMemory* m, DataBackend* be, const Phase& phase);
  Status Broadcast(BatchItems& items, BatchMemory* m, DataBackend* be, const Phase& phase);
  Status Alltoall(BatchItems& items, BatchMemory* m, DataBackend* be, const Phase& phase,
                  std::vector<int64_t>* received);

  ProcessSetTable* sets_;
  const AllreducePlanner* planner_;
  const BackendRegistry* registry_;
  int rank_;
};

}  // namespace hvdl
