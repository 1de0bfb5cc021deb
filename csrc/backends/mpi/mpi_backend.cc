#include "backends/mpi/mpi_backend.h"

#include <climits>
#include <cstring>

#include "backends/mpi/mpi_util.h"
#include "comm/reduce_kernels.h"
#include "common/logging.h"

namespace hvdl {
namespace {

constexpr int64_t kMaxChunk = int64_t{1} << 30;  // elements per MPI call (MPI counts are int)

Status ToInts(const std::vector<int64_t>& counts, const char* what, std::vector<int>* out,
              std::vector<int>* displs) {
  int64_t off = 0;
  out->clear();
  displs->clear();
  for (int64_t c : counts) {
    if (c > INT_MAX || off > INT_MAX) {
      return Status::Internal(std::string(what) + ": more than 2^31-1 elements per rank is not "
                              "supported by the MPI backend; split the tensor.");
    }
    out->push_back(static_cast<int>(c));
    displs->push_back(static_cast<int>(off));
    off += c;
  }
  return Status::Ok();
}

}  // namespace

MpiBackend::MpiBackend(MpiWorld* world, const Config& config)
    : world_(world),
      hierarchy_(world->cross_size() > 1 && world->local_size() > 1 && world->homogeneous()),
      hierarchical_allgather_(hierarchy_ ? config.hierarchical_allgather : Toggle::kOff) {}

MpiBackend::~MpiBackend() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    if (cross_comm_ != MPI_COMM_NULL) MPI_Comm_free(&cross_comm_);
  }
}

// Collective over process set 0 (every rank reaches its first hierarchical collective in the
// same order): private copies of the node and cross communicators, so no message of another
// user of MpiWorld's can ever match ours, and which rank sits where.
Status MpiBackend::HierarchicalComms() {
  if (!rank_at_.empty()) return Status::Ok();  // filled last: everything below is done
  if (local_comm_ == MPI_COMM_NULL) HVDL_RETURN_IF_ERROR(MpiDup(world_->local(), &local_comm_));
  if (cross_comm_ == MPI_COMM_NULL) HVDL_RETURN_IF_ERROR(MpiDup(world_->cross(), &cross_comm_));
  MPI_Comm_set_errhandler(local_comm_, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(cross_comm_, MPI_ERRORS_RETURN);
  world_->AddRevocable(local_comm_);
  world_->AddRevocable(cross_comm_);
  const int me[2] = {world_->cross_rank(), world_->local_rank()};
  std::vector<int> where(2 * static_cast<size_t>(world_->size()));
  HVDL_MPI(MPI_Allgather(me, 2, MPI_INT, where.data(), 2, MPI_INT, world_->data(0)));
  std::vector<int> rank_at(static_cast<size_t>(world_->size()), -1);
  for (int r = 0; r < world_->size(); ++r) {
    rank_at[static_cast<size_t>(where[2 * r] * world_->local_size() + where[2 * r + 1])] = r;
  }
  rank_at_ = std::move(rank_at);
  return Status::Ok();
}

bool MpiBackend::Supports(OpType op, DataType dtype, int device) const {
  return device == kCpuDevice;
}

Status MpiBackend::Comm(int ps, MPI_Comm* comm) const {
  *comm = world_->data(ps);
  if (*comm == MPI_COMM_NULL) {
    return Status::Internal("process set " + std::to_string(ps) +
                            " has no MPI communicator on this rank");
  }
  return Status::Ok();
}

Status MpiBackend::Begin(int ps, MPI_Comm* comm) const {
  HVDL_RETURN_IF_ERROR(Comm(ps, comm));
  return SetSize(ps) > 1 ? MpiMeet(*comm) : Status::Ok();
}

int MpiBackend::SetSize(int ps) const {
  MPI_Comm comm = world_->data(ps);
  int n = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &n);
  return n;
}

// The world's process sets are MpiFabric's: it adds and removes their communicators.
Status MpiBackend::AddProcessSet(int ps, const std::vector<int>& ranks) { return Status::Ok(); }

Status MpiBackend::RemoveProcessSet(int ps) { return Status::Ok(); }

Status MpiBackend::Allreduce(const AllreduceArgs& a) {
  if (!a.chunks.empty()) return Status::Internal("MPI_Allreduce takes one buffer, not spans");
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(a.ps, &comm));
  MPI_Datatype type = MpiType(a.dtype);
  MPI_Op op = MpiOp(a.dtype, a.op);
  char* p = static_cast<char*>(a.buf);
  const size_t esize = DataTypeSize(a.dtype);
  for (int64_t done = 0; done < a.count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, a.count - done));
    HVDL_MPI(MPI_Allreduce(MPI_IN_PLACE, p + done * static_cast<int64_t>(esize), n, type, op, comm));
  }
  if (a.postscale != 1.0) Scale(a.buf, a.count, a.dtype, a.postscale);
  return Status::Ok();
}

Status MpiBackend::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                              DataType dtype, int ps) {
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(ps, &comm));
  std::vector<int> c, d;
  HVDL_RETURN_IF_ERROR(ToInts(counts, "allgather", &c, &d));
  int me = 0;
  MPI_Comm_rank(comm, &me);
  MPI_Datatype type = MpiType(dtype);
  // C + 1 collectives instead of one: worth it once the data, not the latency, dominates. The
  // counts are the same on every rank, so is the choice.
  int64_t total = 0;
  for (int64_t n : counts) total += n * static_cast<int64_t>(DataTypeSize(dtype));
  const bool hierarchical =
      hierarchical_allgather_ == Toggle::kOn ||
      (hierarchical_allgather_ == Toggle::kAuto && total >= kHierarchicalAllgatherBytes);
  if (ps == 0 && hierarchical) {
    const size_t esize = DataTypeSize(dtype);
    if (send != nullptr) {
      std::memcpy(static_cast<char*>(recv) + static_cast<size_t>(d[me]) * esize, send,
                  static_cast<size_t>(c[me]) * esize);
    }
    ++hierarchical_allgathers_;
    return HierarchicalAllgatherv(recv, c, d, type);
  }
  const void* src = send == nullptr ? MPI_IN_PLACE : send;
  HVDL_MPI(MPI_Allgatherv(src, c[static_cast<size_t>(me)], type, recv, c.data(), d.data(), type,
                          comm));
  return Status::Ok();
}

Status MpiBackend::HierarchicalAllgatherv(void* recv, const std::vector<int>& counts,
                                          const std::vector<int>& displs, MPI_Datatype type) {
  HVDL_RETURN_IF_ERROR(HierarchicalComms());
  const int L = world_->local_size(), C = world_->cross_size();
  auto rank = [&](int h, int l) { return static_cast<size_t>(rank_at_[h * L + l]); };
  // 1. Across hosts: the ranks with our local rank, one per host, swap their own blocks.
  std::vector<int> c(static_cast<size_t>(C)), d(static_cast<size_t>(C));
  for (int h = 0; h < C; ++h) {
    c[h] = counts[rank(h, world_->local_rank())];
    d[h] = displs[rank(h, world_->local_rank())];
  }
  HVDL_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, type, recv, c.data(), d.data(), type, cross_comm_));
  // 2. Inside the host, once per host index h: local rank l holds rank (h, l)'s block now.
  c.resize(static_cast<size_t>(L));
  d.resize(static_cast<size_t>(L));
  for (int h = 0; h < C; ++h) {
    for (int l = 0; l < L; ++l) {
      c[l] = counts[rank(h, l)];
      d[l] = displs[rank(h, l)];
    }
    HVDL_MPI(MPI_Allgatherv(MPI_IN_PLACE, 0, type, recv, c.data(), d.data(), type, local_comm_));
  }
  return Status::Ok();
}

Status MpiBackend::Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) {
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(ps, &comm));
  MPI_Datatype type = MpiType(dtype);
  char* p = static_cast<char*>(buf);
  const size_t esize = DataTypeSize(dtype);
  for (int64_t done = 0; done < count; done += kMaxChunk) {
    int n = static_cast<int>(std::min(kMaxChunk, count - done));
    HVDL_MPI(MPI_Bcast(p + done * static_cast<int64_t>(esize), n, type, root, comm));
  }
  return Status::Ok();
}

Status MpiBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts, void* recv,
                             const std::vector<int64_t>& recv_counts, DataType dtype, int ps) {
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(ps, &comm));
  std::vector<int> sc, sd, rc, rd;
  HVDL_RETURN_IF_ERROR(ToInts(send_counts, "alltoall", &sc, &sd));
  HVDL_RETURN_IF_ERROR(ToInts(recv_counts, "alltoall", &rc, &rd));
  MPI_Datatype type = MpiType(dtype);
  HVDL_MPI(MPI_Alltoallv(send, sc.data(), sd.data(), type, recv, rc.data(), rd.data(), type, comm));
  return Status::Ok();
}

Status MpiBackend::ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                                 DataType dtype, ReduceOp op, int ps) {
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(ps, &comm));
  std::vector<int> c, d;
  HVDL_RETURN_IF_ERROR(ToInts(counts, "reducescatter", &c, &d));
  HVDL_MPI(MPI_Reduce_scatter(send, recv, c.data(), MpiType(dtype), MpiOp(dtype, op), comm));
  return Status::Ok();
}

}  // namespace hvdl
