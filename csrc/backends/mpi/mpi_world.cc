#include "backends/mpi/mpi_world.h"

#include <atomic>
#include <mutex>

#include "backends/mpi/mpi_util.h"
#include "common/logging.h"

namespace hvdl {
namespace {

std::atomic<bool> g_we_initialized_mpi{false};  // process-wide: MPI itself is process-wide
// The job's communicator once it changed: the survivors of the last Recover, or the job merged
// with the ranks it spawned (growth); every later Create builds on it. With the rank map of the
// last Recover, it is touched by the background thread (Recover) and then, after it stopped, the
// main thread (Create): Context::Shutdown joins the loop in between.
MPI_Comm g_job = MPI_COMM_NULL;
// Intercommunicators to the ranks spawned by (or the job that spawned) this process: they are
// disconnected before MPI_Finalize.
std::vector<MPI_Comm> g_intercomms;
bool g_parent_merged = false;
struct Growth {
  int count = 0;
  std::string command;
  std::vector<std::string> argv;
  std::string host;  // a host outside the job's allocation to start them on ("": mpirun places)
  std::string env;   // newline-separated VAR=value for the "env" info key ("": none)
} g_growth;
int g_grown = 0;  // ranks this process's job has spawned, in total
// This process left the job (Retire): MPI_Finalize would wait in its fence for the ranks that
// stayed, until the job ends, so it is skipped; ULFM's launcher lets such a process go.
bool g_retired = false;
std::vector<int> g_recovery_map;
std::mutex g_recovery_mu;  // guards the three below (read by Python any time)
int g_recoveries = 0;
std::vector<std::string> g_lost_hosts;  // the host of every rank lost, in the order lost

Status EnsureMpi(int* level) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::Internal("MPI was already finalized in this process; horovodlite cannot start "
                            "again after MPI_Finalize.");
  }
  if (initialized) {
    MPI_Query_thread(level);
    return Status::Ok();
  }
  HVDL_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, level));
  g_we_initialized_mpi = true;
  return Status::Ok();
}

}  // namespace

Status MpiWorld::Create(const MpiWorldOptions& options, std::unique_ptr<MpiWorld>* out) {
  std::unique_ptr<MpiWorld> world(new MpiWorld());
  HVDL_RETURN_IF_ERROR(EnsureMpi(&world->thread_level_));
  InitMpiTypes();
  MpiClearPeerFailure();  // a failure seen while no runtime ran belongs to no world of ours
  HVDL_RETURN_IF_ERROR(world->Build(options));
  *out = std::move(world);
  return Status::Ok();
}

Status MpiWorld::Build(const MpiWorldOptions& options) {
  MPI_Comm base = MPI_COMM_WORLD;
  MPI_Comm created = MPI_COMM_NULL;
  if (g_job == MPI_COMM_NULL && !g_parent_merged) {
    MPI_Comm parent = MPI_COMM_NULL;
    MPI_Comm_get_parent(&parent);
    if (parent != MPI_COMM_NULL) {  // spawned by a growing elastic job: join it, ranks last
      g_parent_merged = true;
      MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
      HVDL_MPI(MPI_Intercomm_merge(parent, 1, &g_job));
      g_intercomms.push_back(parent);
    }
  }
  if (g_job != MPI_COMM_NULL) {
    // The survivors of a loss, or the job with the ranks it spawned: they replace whatever
    // the job communicator was (`comm`/`ranks` describe the first world).
    base = g_job;
  } else if (options.has_comm) {
    base = MPI_Comm_f2c(options.comm_f2c);
  } else if (!options.ranks.empty()) {
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    bool member = false;
    for (int r : options.ranks) member = member || r == world_rank;
    if (!member) {
      return Status::InvalidArgument("init(comm=[...]): this process (MPI_COMM_WORLD rank " +
                                     std::to_string(world_rank) +
                                     ") is not in the requested ranks; call init only on them.");
    }
    MPI_Group world_group, group;
    HVDL_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    HVDL_MPI(MPI_Group_incl(world_group, static_cast<int>(options.ranks.size()),
                            options.ranks.data(), &group));
    HVDL_MPI(MPI_Comm_create_group(MPI_COMM_WORLD, group, 0x4856, &created));
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    base = created;
  }
  if (g_growth.count > 0) {  // collective over `base`: rank 0 starts the new ranks
    Growth growth = std::move(g_growth);
    g_growth = Growth();
    std::vector<char*> argv;
    for (std::string& a : growth.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    std::vector<int> codes(static_cast<size_t>(growth.count));
    MPI_Info info = MPI_INFO_NULL;
    if (!growth.env.empty()) {
      // the job's secrets: Open MPI sets each line in the spawned processes' environment, as
      // mpirun's -x does for the others (never on argv, which ps shows on the new host)
      if (growth.env.size() >= MPI_MAX_INFO_VAL) {
        return Status::InvalidArgument(
            "elastic growth: the environment for the new ranks is " +
            std::to_string(growth.env.size()) + " bytes, more than MPI_Comm_spawn's info " +
            "value holds (" + std::to_string(MPI_MAX_INFO_VAL - 1) + ")");
      }
      MPI_Info_create(&info);
#if defined(OMPI_MAJOR_VERSION) && OMPI_MAJOR_VERSION >= 5
      MPI_Info_set(info, "PMIX_ENVAR", growth.env.c_str());  // "env" is deprecated there
#else
      MPI_Info_set(info, "env", growth.env.c_str());
#endif
    }
    if (!growth.host.empty()) {
      // PRRTE (Open MPI 5.0.11) adds the host to the job's allocation, starting a daemon there
      // through the job's rsh agent, and places the ranks on it. Measured: the slot count
      // belongs in PMIX_ADD_HOST only - "host:N" in PMIX_HOST crashed PRRTE's mapper; several
      // hosts in one MPI_Comm_spawn_multiple left the new ranks unable to reach each other.
      if (info == MPI_INFO_NULL) MPI_Info_create(&info);
      const std::string add = growth.host + ":" + std::to_string(growth.count);
      MPI_Info_set(info, "PMIX_ADD_HOST", add.c_str());
      MPI_Info_set(info, "PMIX_HOST", growth.host.c_str());
    }
    const int rc = MPI_Comm_spawn(growth.command.data(), argv.data(), growth.count, info, 0, base,
                                  &inter, codes.data());
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Comm_spawn");
    MPI_Comm_set_errhandler(inter, MPI_ERRORS_RETURN);
    HVDL_MPI(MPI_Intercomm_merge(inter, 0, &merged));
    g_intercomms.push_back(inter);
    g_job = merged;
    base = merged;
    g_grown += growth.count;
  }
  MPI_Comm data = MPI_COMM_NULL;
  // The ranks arrive here seconds apart (process start, imports, one rank restarting after
  // another): they meet in the first duplication, waited for without spinning; the blocking
  // calls below then run together.
  HVDL_RETURN_IF_ERROR(MpiDup(base, &control_));
  HVDL_RETURN_IF_ERROR(MpiDup(base, &data));
  if (created != MPI_COMM_NULL) MPI_Comm_free(&created);
  MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(data, MPI_ERRORS_RETURN);
  MpiSetFailureProbe(control_);
  data_[0] = data;
  MPI_Comm_rank(control_, &rank_);
  MPI_Comm_size(control_, &size_);
  HVDL_MPI(MPI_Comm_split_type(control_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_));
  MPI_Comm_rank(local_, &local_rank_);
  MPI_Comm_size(local_, &local_size_);
  HVDL_MPI(MPI_Comm_split(control_, local_rank_, rank_, &cross_));
  MPI_Comm_rank(cross_, &cross_rank_);
  MPI_Comm_size(cross_, &cross_size_);
  // Homogeneous: every node runs the same number of ranks.
  int sizes[2] = {local_size_, -local_size_};
  HVDL_MPI(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MIN, control_));
  homogeneous_ = sizes[0] == -sizes[1];
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int name_len = 0;
  MPI_Get_processor_name(name, &name_len);
  std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
  HVDL_MPI(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                         MPI_MAX_PROCESSOR_NAME, MPI_CHAR, control_));
  for (size_t r = 0; r < static_cast<size_t>(size_); ++r) {
    hosts_.emplace_back(&names[r * MPI_MAX_PROCESSOR_NAME]);
  }
  return Status::Ok();
}

void MpiWorld::AddRevocable(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) revocable_.push_back(comm);
}

Status MpiWorld::Recover(std::string* what) {
#if HVDL_HAVE_ULFM
  // Every survivor blocked in a call on any of these returns with MPIX_ERR_REVOKED and comes
  // here too; revoking twice (several ranks noticed at once) is harmless.
  MPIX_Comm_revoke(control_);
  for (auto& kv : data_) {
    if (kv.second != MPI_COMM_NULL) MPIX_Comm_revoke(kv.second);
  }
  MPIX_Comm_revoke(local_);
  MPIX_Comm_revoke(cross_);
  for (MPI_Comm c : revocable_) MPIX_Comm_revoke(c);
  MPI_Comm survivors = MPI_COMM_NULL;
  int rc = MPIX_Comm_shrink(control_, &survivors);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPIX_Comm_shrink");
  MPI_Comm_set_errhandler(survivors, MPI_ERRORS_RETURN);
  MPI_Group old_group, new_group;
  MPI_Comm_group(control_, &old_group);
  MPI_Comm_group(survivors, &new_group);
  std::vector<int> old_ranks(static_cast<size_t>(size_)), new_ranks(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) old_ranks[static_cast<size_t>(r)] = r;
  MPI_Group_translate_ranks(old_group, size_, old_ranks.data(), new_group, new_ranks.data());
  MPI_Group_free(&old_group);
  MPI_Group_free(&new_group);
  std::string lost;
  std::vector<std::string> lost_hosts;
  int nlost = 0;
  for (int r = 0; r < size_; ++r) {
    int& n = new_ranks[static_cast<size_t>(r)];
    if (n == MPI_UNDEFINED) n = -1;
    if (n >= 0) continue;
    lost += (nlost++ ? ", " : "") + std::to_string(r) + " (host " + host(r) + ")";
    lost_hosts.push_back(host(r));
  }
  int remain = 0;
  MPI_Comm_size(survivors, &remain);
  *what = "lost rank" + std::string(nlost == 1 ? " " : "s ") + lost + " of " +
          std::to_string(size_) + "; " + std::to_string(remain) + " rank" +
          (remain == 1 ? " remains" : "s remain");
  g_job = survivors;  // the previous one is revoked: left to MPI
  {
    std::lock_guard<std::mutex> lock(g_recovery_mu);
    g_recovery_map = std::move(new_ranks);
    ++g_recoveries;
    g_lost_hosts.insert(g_lost_hosts.end(), lost_hosts.begin(), lost_hosts.end());
  }
  MpiClearPeerFailure();
  return Status::Ok();
#else
  (void)what;
  return Status::Internal("this MPI has no ULFM (fault tolerance): a lost rank ends the job");
#endif
}

std::vector<int> MpiWorld::LastRecoveryMap() {
  std::lock_guard<std::mutex> lock(g_recovery_mu);
  return g_recovery_map;
}

int MpiWorld::Recoveries() {
  std::lock_guard<std::mutex> lock(g_recovery_mu);
  return g_recoveries;
}

std::vector<std::string> MpiWorld::LostHosts() {
  std::lock_guard<std::mutex> lock(g_recovery_mu);
  return g_lost_hosts;
}

bool UlfmBuilt() { return HVDL_HAVE_ULFM != 0; }

MpiWorld::~MpiWorld() {
  MpiSetFailureProbe(MPI_COMM_NULL);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& kv : data_) {
    if (kv.second != MPI_COMM_NULL) MPI_Comm_free(&kv.second);
  }
  if (cross_ != MPI_COMM_NULL) MPI_Comm_free(&cross_);
  if (local_ != MPI_COMM_NULL) MPI_Comm_free(&local_);
  if (control_ != MPI_COMM_NULL) MPI_Comm_free(&control_);
}

MPI_Comm MpiWorld::data(int ps) const {
  auto it = data_.find(ps);
  return it == data_.end() ? MPI_COMM_NULL : it->second;
}

Status MpiWorld::AddProcessSet(int ps, const std::vector<int>& ranks) {
  bool member = false;
  for (int r : ranks) member = member || r == rank_;
  MPI_Comm comm = MPI_COMM_NULL;
  HVDL_RETURN_IF_ERROR(MpiMeet(data_.at(0)));  // MPI_Comm_split spins: start it together
  HVDL_MPI(MPI_Comm_split(data_.at(0), member ? 0 : MPI_UNDEFINED, rank_, &comm));
  if (comm != MPI_COMM_NULL) MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  data_[ps] = comm;
  return Status::Ok();
}

Status MpiWorld::RemoveProcessSet(int ps) {
  auto it = data_.find(ps);
  if (it == data_.end() || ps == 0) return Status::Ok();
  if (it->second != MPI_COMM_NULL) HVDL_MPI(MPI_Comm_free(&it->second));
  data_.erase(it);
  return Status::Ok();
}

void FinalizeMpiIfOwned() {
  if (!g_we_initialized_mpi.exchange(false)) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_retired) return;
  for (MPI_Comm& c : g_intercomms) MPI_Comm_disconnect(&c);  // spawned jobs must be let go
  MPI_Finalize();
}

void MpiRequestGrowth(int count, const std::string& command,
                      const std::vector<std::string>& argv, const std::string& host,
                      const std::vector<std::string>& env) {
  g_growth.count = count;
  g_growth.command = command;
  g_growth.argv = argv;
  g_growth.host = host;
  g_growth.env.clear();
  for (const std::string& line : env) g_growth.env += (g_growth.env.empty() ? "" : "\n") + line;
}

int MpiGrown() { return g_grown; }

bool MpiRetired() { return g_retired; }

Status MpiRetire(bool leaving, std::vector<int>* map) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized || g_retired) {
    return Status::Internal("retiring ranks needs a running MPI job this process belongs to");
  }
  MPI_Comm job = g_job != MPI_COMM_NULL ? g_job : MPI_COMM_WORLD;
  int rank = 0, size = 0;
  MPI_Comm_rank(job, &rank);
  MPI_Comm_size(job, &size);
  MPI_Comm stay = MPI_COMM_NULL;
  HVDL_MPI(MPI_Comm_split(job, leaving ? MPI_UNDEFINED : 0, rank, &stay));
  // old rank -> new rank (-1: left), the same on every rank: gathered over the old job
  int mine = -1;
  if (stay != MPI_COMM_NULL) MPI_Comm_rank(stay, &mine);
  std::vector<int> next(static_cast<size_t>(size), -1);
  HVDL_MPI(MPI_Allgather(&mine, 1, MPI_INT, next.data(), 1, MPI_INT, job));
  *map = next;
  if (leaving) {
    g_retired = true;
    return Status::Ok();
  }
  MPI_Comm_set_errhandler(stay, MPI_ERRORS_RETURN);
  g_job = stay;  // the previous one still holds the leavers: left to MPI
  {
    std::lock_guard<std::mutex> lock(g_recovery_mu);
    g_recovery_map = std::move(next);
    ++g_recoveries;
  }
  return Status::Ok();
}

bool MpiSpawned() { return g_parent_merged; }

}  // namespace hvdl
