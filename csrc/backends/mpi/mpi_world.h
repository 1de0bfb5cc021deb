// MpiWorld: MPI initialisation and every communicator horovodlite uses.
//
// Created by Context::Init on the caller's (main) thread, which makes it collective over the job:
//   - initialises MPI with MPI_THREAD_MULTIPLE unless MPI is already initialised (mpi4py), in
//     which case that MPI is reused and never finalised by us;
//   - duplicates the job communicator (world, an mpi4py communicator, or a list of ranks) twice:
//     one copy for negotiation, one for data, so their messages can never match each other;
//   - derives the node-local and cross-node communicators.
// Process-set communicators are added and removed later by the background thread, in the agreed
// order, with MPI_Comm_split over the data communicator. The destructor frees everything (main
// thread, after the background thread stopped).
//
// Elastic jobs (ULFM, see mpi_util.h): when ranks fail, the background thread calls Recover(),
// which revokes every communicator of this world (so every survivor's pending call fails too),
// agrees with the other survivors on who is left (MPIX_Comm_shrink) and keeps the survivors'
// communicator as the successor: the next Create without an explicit communicator builds the new
// world on it, renumbered 0..n-1 in the old order.
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvdl {

struct MpiWorldOptions {
  bool has_comm = false;   // use `comm_f2c` (an mpi4py communicator's Fortran handle)
  int comm_f2c = 0;
  std::vector<int> ranks;  // non-empty: the job is these ranks of MPI_COMM_WORLD
};

class MpiWorld {
 public:
  static Status Create(const MpiWorldOptions& options, std::unique_ptr<MpiWorld>* out);
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  // Every node runs the same number of ranks (local_size is the same everywhere).
  bool homogeneous() const { return homogeneous_; }
  bool thread_multiple() const { return thread_level_ >= MPI_THREAD_MULTIPLE; }

  MPI_Comm control() const { return control_; }
  // The ranks of this node, and the ranks with this local rank on every node (hierarchical
  // allreduce); both span the whole job (process set 0).
  MPI_Comm local() const { return local_; }
  MPI_Comm cross() const { return cross_; }
  // The data communicator of process set `ps`; MPI_COMM_NULL if this rank is not a member.
  MPI_Comm data(int ps) const;
  // Collective over every rank (background thread).
  Status AddProcessSet(int ps, const std::vector<int>& ranks);
  Status RemoveProcessSet(int ps);
  // A communicator derived from this world elsewhere (the backend's private copies): revoked by
  // Recover too. It must stay valid until this world is destroyed.
  void AddRevocable(MPI_Comm comm);
  // The host each rank runs on (MPI_Get_processor_name, gathered at creation).
  const std::string& host(int rank) const { return hosts_.at(static_cast<size_t>(rank)); }

  // Background thread, after MpiIsPeerFailure: see the top of this file. *what describes it in
  // one line ("lost rank 2 (host h) of 3; 2 ranks remain"). Collective over the survivors.
  // Called once per world; the world is never destroyed afterwards (Context::recovered).
  Status Recover(std::string* what);
  // The last Recover's survivors, as (old rank -> new rank, -1 if lost); empty if none.
  static std::vector<int> LastRecoveryMap();
  static int Recoveries();  // how many Recover calls succeeded in this process
  static std::vector<std::string> LostHosts();  // the host of each rank Recover found lost

 private:
  MpiWorld() = default;
  Status Build(const MpiWorldOptions& options);

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  bool homogeneous_ = true;
  int thread_level_ = MPI_THREAD_SINGLE;
  MPI_Comm control_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  std::map<int, MPI_Comm> data_;  // process set id -> communicator (0 = the whole job)
  std::vector<MPI_Comm> revocable_;
  std::vector<std::string> hosts_;
};

// True if this build's MPI has ULFM (see mpi_util.h).
bool UlfmBuilt();

// Finalises MPI if horovodlite initialised it and nobody finalised it yet. Main thread, at exit.
void FinalizeMpiIfOwned();

// Elastic growth: the next Create first starts `count` new processes running `command argv`
// (MPI_Comm_spawn, collective over the job) and merges them into the job, after its ranks.
// `host` non-empty: on that host, added to the job's allocation first (a host outside -H);
// empty: where mpirun places them. `env`: VAR=value set in the new ranks' environment by the
// MPI runtime (MPI_Comm_spawn's "env" info key: not on their command line); its lines together
// must fit an info value (MPI_MAX_INFO_VAL). Main thread, on every rank of the job, before
// that Create.
void MpiRequestGrowth(int count, const std::string& command,
                      const std::vector<std::string>& argv, const std::string& host,
                      const std::vector<std::string>& env = {});
int MpiGrown();  // ranks the job spawned so far (as seen by this process)
// Elastic shrinking on purpose (the ranks of hosts a discovery script no longer lists): every
// rank of the job calls it, no runtime running, `leaving` true on the ranks that go. Collective
// over the job. *map: old rank -> new rank, -1 for the ones that left. The ranks that stay
// continue on a job of their own (the next Create builds on it; LastRecoveryMap/Recoveries
// report it as they report a recovery); a leaving rank must not use MPI again and is not
// finalised (MPI_Finalize would wait for the whole job): it exits.
Status MpiRetire(bool leaving, std::vector<int>* map);
bool MpiRetired();  // this process left its job (Retire with leaving)
bool MpiSpawned();  // this process was started by a growing job and joined it

}  // namespace hvdl
