#include "testing/thread_backend.h"

#include <cstring>

#include "comm/reduce_kernels.h"

namespace hvdl {
namespace {

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displ(counts.size(), 0);
  for (size_t m = 1; m < counts.size(); ++m) displ[m] = displ[m - 1] + counts[m - 1];
  return displ;
}

size_t Bytes(int64_t count, DataType dtype) {
  return static_cast<size_t>(count) * DataTypeSize(dtype);
}

const char* At(const void* base, int64_t elems, DataType dtype) {
  return static_cast<const char*>(base) + Bytes(elems, dtype);
}

// Alltoall publishes its send buffer together with its counts.
struct AlltoallSend {
  const void* data;
  const std::vector<int64_t>* counts;
};

}  // namespace

std::vector<const void*> ThreadFabric::Exchange(int rank, const void* mine) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    slots_[static_cast<size_t>(rank)] = mine;
  }
  Barrier();
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
}

void ThreadFabric::Barrier() {
  std::unique_lock<std::mutex> lock(mu_);
  const long generation = generation_;
  if (++arrived_ == n_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation_ != generation; });
  }
}

bool ThreadBackend::Supports(OpType op, DataType dtype, int device) const {
  return device_buffers_ ? device != kCpuDevice : device == kCpuDevice;
}

Status ThreadBackend::AddProcessSet(int ps, const std::vector<int>& ranks) {
  return Status::Internal("ThreadBackend has only process set 0");
}

Status ThreadBackend::Allreduce(const AllreduceArgs& a) {
  if (a.ps != 0 || !a.chunks.empty()) return Status::Internal("ThreadBackend: unsupported allreduce");
  auto all = fabric_->Exchange(rank_, a.buf);
  std::vector<char> sum(static_cast<const char*>(all[0]),
                        static_cast<const char*>(all[0]) + Bytes(a.count, a.dtype));
  for (size_t i = 1; i < all.size(); ++i) ReduceInto(sum.data(), all[i], a.count, a.dtype, a.op);
  fabric_->Barrier();
  std::memcpy(a.buf, sum.data(), sum.size());
  Scale(a.buf, a.count, a.dtype, a.postscale);
  return Status::Ok();
}

Status ThreadBackend::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                                 DataType dtype, int ps) {
  const std::vector<int64_t> displ = Offsets(counts);
  const size_t me = static_cast<size_t>(rank_);
  const void* mine = send != nullptr ? send : At(recv, displ[me], dtype);
  auto all = fabric_->Exchange(rank_, mine);
  for (size_t m = 0; m < all.size(); ++m) {
    if (m == me && send == nullptr) continue;  // already in place
    std::memcpy(const_cast<char*>(At(recv, displ[m], dtype)), all[m], Bytes(counts[m], dtype));
  }
  fabric_->Barrier();
  return Status::Ok();
}

Status ThreadBackend::Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) {
  auto all = fabric_->Exchange(rank_, buf);
  if (rank_ != root) std::memcpy(buf, all[static_cast<size_t>(root)], Bytes(count, dtype));
  fabric_->Barrier();
  return Status::Ok();
}

Status ThreadBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                                void* recv, const std::vector<int64_t>& recv_counts,
                                DataType dtype, int ps) {
  AlltoallSend mine{send, &send_counts};
  auto all = fabric_->Exchange(rank_, &mine);
  const std::vector<int64_t> rdispl = Offsets(recv_counts);
  for (size_t m = 0; m < all.size(); ++m) {
    const auto* peer = static_cast<const AlltoallSend*>(all[m]);
    const std::vector<int64_t> sdispl = Offsets(*peer->counts);
    const size_t me = static_cast<size_t>(rank_);
    std::memcpy(const_cast<char*>(At(recv, rdispl[m], dtype)), At(peer->data, sdispl[me], dtype),
                Bytes(recv_counts[m], dtype));
  }
  fabric_->Barrier();
  return Status::Ok();
}

Status ThreadBackend::ReduceScatter(const void* send, void* recv,
                                    const std::vector<int64_t>& counts, DataType dtype,
                                    ReduceOp op, int ps) {
  const std::vector<int64_t> displ = Offsets(counts);
  const size_t me = static_cast<size_t>(rank_);
  auto all = fabric_->Exchange(rank_, send);
  std::vector<char> sum(At(all[0], displ[me], dtype),
                        At(all[0], displ[me], dtype) + Bytes(counts[me], dtype));
  for (size_t i = 1; i < all.size(); ++i) {
    ReduceInto(sum.data(), At(all[i], displ[me], dtype), counts[me], dtype, op);
  }
  fabric_->Barrier();
  std::memcpy(recv, sum.data(), sum.size());
  return Status::Ok();
}

}  // namespace hvdl
