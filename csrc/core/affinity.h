// Pinning a rank to one CPU (HOROVOD_BIND_RANKS; off by default).
//
// When a host runs as many ranks as the CPUs they may use, every CPU has one rank's training
// thread, and each rank's background thread mostly alternates with it (it holds new work until
// the training thread waits). Unpinned, the kernel sometimes placed two ranks' active threads
// on one CPU while the other idled: on a 2-vCPU VM at np 2, 200 tensors of 64 KiB submitted
// together took up to 25% longer for ~0.1 s after gloo's threads had run in the process (the
// load signals the scheduler's placement reads decay over about that long); pinned, the
// effect was gone (0.90-0.92x of 200 MPI_Allreduce calls right after gloo and otherwise, against
// 0.92-1.16x unpinned, in one job each). But everything the rank starts afterwards shares its
// CPU - gloo's threads made its 200-tensor case 3x slower, DataLoader workers would be confined
// the same way - and with the per-tensor work of later changes the unpinned fusion case read
// 0.89-0.93x anyway, so it is not the default.
#pragma once

#include <vector>

#include "common/config.h"

namespace hvdl {

// The CPU a rank pins itself to: `allowed` are the CPUs the process may use (its affinity mask
// when first asked, in order), `local_rank`/`local_size` its place on the host. kAuto: allowed[i]
// for local rank i when the host's ranks are exactly as many as those CPUs; kOn: allowed[i mod
// n] whenever there is at least one; kOff: never. -1: do not pin.
int ChooseRankCpu(Toggle mode, const std::vector<int>& allowed, int local_rank, int local_size);

// Pins the calling thread (and so the threads it starts later, the background thread among them)
// as ChooseRankCpu says, from the affinity the thread had at the first call (re-initialisation
// recomputes from it, and restores it when the answer is not to pin). Returns the CPU, or -1
// when not pinned (or not Linux).
int BindCallingThread(Toggle mode, int local_rank, int local_size);

}  // namespace hvdl
