// The job beyond one runtime: elastic recovery records, growth and retirement, and the
// transport's end at process exit. These outlive Contexts (an elastic reset shuts one down and
// starts the next); the transport that implements them (MPI with ULFM) is chosen here.
// Main thread unless said otherwise.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"

namespace hvdl {

// Finalises the transport at process exit if horovodlite initialised it.
void FinalizeCommTransport();
// After a recovery: old rank -> rank among the survivors (-1: lost). Empty before any.
std::vector<int> LastRecoveryMap();
int Recoveries();
// The host of every rank this process saw lost (recoveries), in the order lost; elastic jobs
// blacklist hosts from it.
std::vector<std::string> LostHosts();
// Elastic growth: spawn `count` ranks at the next init; how many so far; whether this process
// is one of them. `env`: VAR=value the new ranks get in their environment from the MPI runtime
// (the job's secrets: never on their command line, which ps shows).
void RequestGrowth(int count, const std::string& command, const std::vector<std::string>& argv,
                   const std::string& host, const std::vector<std::string>& env = {});
int Grown();
bool Spawned();
// Elastic retirement: every rank of the job calls it with no runtime running, `leaving` true on
// the ranks that go; *map: old rank -> new rank, -1 for those that left. Collective.
Status Retire(bool leaving, std::vector<int>* map);
bool Retired();

}  // namespace hvdl
