#include "runtime/job_control.h"

#if HVDL_WITH_MPI
#include "backends/mpi/mpi_world.h"
#endif

namespace hvdl {

#if HVDL_WITH_MPI
void FinalizeCommTransport() { FinalizeMpiIfOwned(); }
std::vector<int> LastRecoveryMap() { return MpiWorld::LastRecoveryMap(); }
int Recoveries() { return MpiWorld::Recoveries(); }
std::vector<std::string> LostHosts() { return MpiWorld::LostHosts(); }
void RequestGrowth(int count, const std::string& command, const std::vector<std::string>& argv,
                   const std::string& host, const std::vector<std::string>& env) {
  MpiRequestGrowth(count, command, argv, host, env);
}
int Grown() { return MpiGrown(); }
bool Spawned() { return MpiSpawned(); }
Status Retire(bool leaving, std::vector<int>* map) { return MpiRetire(leaving, map); }
bool Retired() { return MpiRetired(); }
#else
void FinalizeCommTransport() {}
std::vector<int> LastRecoveryMap() { return {}; }
int Recoveries() { return 0; }
std::vector<std::string> LostHosts() { return {}; }
void RequestGrowth(int, const std::string&, const std::vector<std::string>&, const std::string&,
                   const std::vector<std::string>&) {}
int Grown() { return 0; }
bool Spawned() { return false; }
Status Retire(bool, std::vector<int>*) {
  return Status::Internal("this horovodlite has no transport that can retire ranks");
}
bool Retired() { return false; }
#endif

}  // namespace hvdl
