// Launcher watch: a rank whose launcher died stops instead of running on as an orphan.
//
// Open MPI starts each rank in its own process group, so a launcher killed with SIGKILL (an
// out-of-memory kill, a scheduler's hard limit, `kill -9` of the job) cannot take its ranks
// down, and ranks that only talk to each other over shared memory never notice: they keep
// training, holding the GPU and the timeline file, with nobody reading their output.
// Under a launcher (OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK set) a thread checks once a
// second whether the rank's parent (the launcher or its node daemon) is gone; if so it logs
// the reason, sends the process SIGTERM (what the launcher would have sent) and, if the process
// is still alive 5 s later, exits with status 1.
#pragma once

namespace hvdl {

// Starts the watch once per process; later calls do nothing. `rank` is for the message.
void WatchLauncher(int rank);

}  // namespace hvdl
