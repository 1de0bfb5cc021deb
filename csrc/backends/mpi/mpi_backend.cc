#include "backends/mpi/mpi_backend.h"

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>

#include "backends/mpi/mpi_util.h"
#include "comm/hierarchical.h"
#include "comm/reduce_kernels.h"
#include "comm/ring.h"
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

// Blocking MPI calls busy-poll. A rank whose background thread enters a collective before its
// peers' threads do (they notice the agreed response at their next poll, or wait for a core that
// training threads hold) would spin on a core the training needs - measured: 20 ms of CPU per
// training step on a 2-core machine. So the ranks first meet in a non-blocking barrier that is
// waited on politely (test, then sleep with backoff), and start the data transfer together.
Status Meet(MPI_Comm comm) {
  using Clock = std::chrono::steady_clock;
  constexpr auto kSpin = std::chrono::microseconds(30);
  constexpr auto kMaxSleep = std::chrono::microseconds(200);
  MPI_Request req;
  HVDL_MPI(MPI_Ibarrier(comm, &req));
  const auto start = Clock::now();
  auto sleep = std::chrono::microseconds(8);
  while (true) {
    int done = 0;
    HVDL_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return Status::Ok();
    if (Clock::now() - start < kSpin) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kMaxSleep);
  }
}

}  // namespace

MpiBackend::MpiBackend(MpiWorld* world, const Config& config)
    : world_(world),
      algorithm_(config.allreduce_algorithm),
      ring_threshold_(config.ring_threshold_bytes),
      segment_bytes_(config.ring_segment_bytes > 0
                         ? static_cast<size_t>(config.ring_segment_bytes)
                         : kHostSegmentBytes),
      network_segment_bytes_(config.ring_segment_bytes > 0
                                 ? static_cast<size_t>(config.ring_segment_bytes)
                                 : kNetworkSegmentBytes),
      single_copy_(config.ring_single_copy),
      hierarchy_(world->cross_size() > 1 && world->local_size() > 1 && world->homogeneous()),
      hierarchical_allreduce_(config.hierarchical_allreduce),
      hierarchical_allgather_(hierarchy_ ? config.hierarchical_allgather : Toggle::kOff) {
  if (config.hierarchical_allreduce == Toggle::kOn && !hierarchy_ && world->rank() == 0) {
    HVDL_LOG(Warning) << "HOROVOD_HIERARCHICAL_ALLREDUCE=1 ignored: it needs several hosts with "
                      << "the same number of ranks on each, and more than one on some (this "
                      << "job: " << world->cross_size() << " host(s), "
                      << (world->homogeneous() ? "the same number" : "different numbers")
                      << " of ranks per host); the flat ring is used";
  }
}

MpiBackend::~MpiBackend() {
  local_.reset();
  cross_.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) {
    if (local_comm_ != MPI_COMM_NULL) MPI_Comm_free(&local_comm_);
    if (cross_comm_ != MPI_COMM_NULL) MPI_Comm_free(&cross_comm_);
  }
}

bool MpiBackend::Hierarchical(int ps, bool ring) const {
  if (!hierarchy_ || ps != 0) return false;
  return hierarchical_allreduce_ == Toggle::kOn ||
         (hierarchical_allreduce_ == Toggle::kAuto && algorithm_ == AllreduceAlgorithm::kAuto &&
          ring);
}

// Collective over process set 0 (every rank reaches its first hierarchical collective in the
// same order): private copies of the node and cross communicators, so no message of another
// user of MpiWorld's can ever match ours, and which rank sits where.
Status MpiBackend::HierarchicalComms() {
  if (!rank_at_.empty()) return Status::Ok();  // filled last: everything below is done
  if (local_comm_ == MPI_COMM_NULL) HVDL_MPI(MPI_Comm_dup(world_->local(), &local_comm_));
  if (cross_comm_ == MPI_COMM_NULL) HVDL_MPI(MPI_Comm_dup(world_->cross(), &cross_comm_));
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

Status MpiBackend::HierarchicalTransports(MpiTransport** local, MpiTransport** cross) {
  if (!local_) {
    HVDL_RETURN_IF_ERROR(HierarchicalComms());
    local_ = std::make_unique<MpiTransport>(local_comm_, single_copy_);
    cross_ = std::make_unique<MpiTransport>(cross_comm_, single_copy_);
  }
  *local = local_.get();
  *cross = cross_.get();
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
  return SetSize(ps) > 1 ? Meet(*comm) : Status::Ok();
}

int MpiBackend::SetSize(int ps) const {
  MPI_Comm comm = world_->data(ps);
  int n = 0;
  if (comm != MPI_COMM_NULL) MPI_Comm_size(comm, &n);
  return n;
}

MpiTransport* MpiBackend::TransportFor(int ps) {
  auto it = transports_.find(ps);
  if (it == transports_.end()) {
    auto t = std::make_unique<MpiTransport>(world_->data(ps), single_copy_);  // collective
    it = transports_.emplace(ps, std::move(t)).first;
  }
  return it->second.get();
}

int MpiBackend::single_copy_transports() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers() > 0 ? 1 : 0;
  return n;
}

int MpiBackend::single_copy_peers() const {
  int n = 0;
  for (const auto& kv : transports_) n += kv.second->single_copy_peers();
  return n;
}

Status MpiBackend::AddProcessSet(int ps, const std::vector<int>& ranks) {
  return world_->AddProcessSet(ps, ranks);
}

Status MpiBackend::RemoveProcessSet(int ps) {
  transports_.erase(ps);
  return world_->RemoveProcessSet(ps);
}

bool MpiBackend::UsesRing(int64_t bytes, int tensors, DataType dtype, ReduceOp op,
                          int ps) const {
  if (algorithm_ == AllreduceAlgorithm::kRing || Hierarchical(ps, false)) return true;
  if (algorithm_ == AllreduceAlgorithm::kMpi) return false;
  const int n = SetSize(ps);
  if (n <= 1) return false;
  const bool non_associative = IsFloatingPoint(dtype) && (op == ReduceOp::kSum ||
                                                          op == ReduceOp::kAverage ||
                                                          op == ReduceOp::kProduct);
  if (n >= 3 && non_associative) return true;
  if (tensors > 1) return bytes >= kFusedRingBytes;
  return ring_threshold_ >= 0 && bytes >= ring_threshold_;
}

Status MpiBackend::Allreduce(const AllreduceArgs& a) {
  MPI_Comm comm;
  HVDL_RETURN_IF_ERROR(Begin(a.ps, &comm));
  const int64_t bytes = a.count * static_cast<int64_t>(DataTypeSize(a.dtype));
  const bool ring = !a.chunks.empty() || UsesRing(bytes, 1, a.dtype, a.op, a.ps);
  if (Hierarchical(a.ps, ring)) {
    MpiTransport *local, *cross;
    HVDL_RETURN_IF_ERROR(HierarchicalTransports(&local, &cross));
    ++hierarchical_calls_;
    return HierarchicalAllreduce(
        local, cross,
        a.chunks.empty() ? ContiguousChunks(a.buf, EvenChunks(a.count, SetSize(a.ps)), a.dtype)
                         : a.chunks,
        a.dtype, a.op, a.postscale, segment_bytes_, network_segment_bytes_, nullptr);
  }
  if (ring) {
    MpiTransport* t = TransportFor(a.ps);
    // A ring in a job over several hosts has network links (a process set's may not). Every
    // member must use the same size - their messages must match: the job spans hosts on every
    // rank alike (cross_size would not do: 1 for a host's second rank in a 2+1 job).
    const size_t segment =
        world_->local_size() < world_->size() ? network_segment_bytes_ : segment_bytes_;
    if (!a.chunks.empty()) {
      return RingAllreduce(t, a.chunks, a.dtype, a.op, a.postscale, segment, nullptr);
    }
    return RingAllreduce(t, ContiguousChunks(a.buf, EvenChunks(a.count, t->size()), a.dtype),
                         a.dtype, a.op, a.postscale, segment, nullptr);
  }
  if (!a.chunks.empty()) return Status::Internal("span allreduce needs the ring algorithm");
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
