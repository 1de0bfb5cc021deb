#include "backends/nccl/nccl_backend.h"

#include <functional>

#include "backends/nccl/nccl_util.h"
#include "comm/allreduce_planner.h"

namespace hvdl {
namespace {

std::vector<int64_t> Offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> displ(counts.size(), 0);
  for (size_t m = 1; m < counts.size(); ++m) displ[m] = displ[m - 1] + counts[m - 1];
  return displ;
}

bool AllEqual(const std::vector<int64_t>& counts) {
  for (int64_t c : counts) {
    if (c != counts.front()) return false;
  }
  return true;
}

char* At(void* base, int64_t elems, size_t esize) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esize);
}

// Runs `body` between ncclGroupStart and ncclGroupEnd; the group is always closed and the first
// error wins.
Status Group(int rank_, const std::function<Status()>& body) {
  HVDL_NCCL(ncclGroupStart());
  Status s = body();
  ncclResult_t end = ncclGroupEnd();
  if (!s.ok()) return s;
  if (end != ncclSuccess) return NcclStatus(end, "ncclGroupEnd", rank_);
  return Status::Ok();
}

}  // namespace

NcclBackend::NcclBackend(Fabric* fabric, DataBackend* host, DeviceOps* ops, int rank)
    : fabric_(fabric), host_(host), ops_(ops), rank_(rank), comms_(rank) {}

NcclBackend::~NcclBackend() = default;

int NcclBackend::CompiledVersion() { return NCCL_VERSION_CODE; }

int NcclBackend::RuntimeVersion() {
  int v = 0;
  return ncclGetVersion(&v) == ncclSuccess ? v : 0;
}

bool NcclBackend::Supports(OpType op, DataType dtype, int device) const {
  if (device == kCpuDevice) return false;
  switch (op) {
    case OpType::kAllreduce:
    case OpType::kAllgather:
    case OpType::kBroadcast:
    case OpType::kAlltoall:
    case OpType::kReducescatter: {
      ncclDataType_t t;
      return NcclType(dtype, &t);
    }
    default:
      return false;
  }
}

Status NcclBackend::Type(DataType dtype, ncclDataType_t* out) const {
  if (NcclType(dtype, out)) return Status::Ok();
  return Status::Internal(std::string("NCCL has no ") + DataTypeName(dtype) + " type");
}

Status NcclBackend::Comm(int ps, NcclComm** out) {
  return comms_.Get(
      ps,
      [this, ps] {
        NcclBootstrap b;
        b.rank = fabric_->SetRank(ps);
        b.size = fabric_->SetSize(ps);
        DataBackend* host = host_;
        b.broadcast = [host, ps](void* data, size_t bytes) {
          return host->Broadcast(data, static_cast<int64_t>(bytes), DataType::kUInt8, 0, ps);
        };
        return b;
      },
      ops_->device(), out);
}

Status NcclBackend::RemoveProcessSet(int ps) {
  comms_.Destroy(ps);
  return Status::Ok();
}

int NcclBackend::SetSize(int ps) const { return fabric_->SetSize(ps); }

Status NcclBackend::Allreduce(const AllreduceArgs& a) {
  if (!a.chunks.empty()) return Status::Internal("NCCL allreduce takes one buffer, not spans");
  ncclDataType_t type;
  HVDL_RETURN_IF_ERROR(Type(a.dtype, &type));
  if (a.plan != nullptr && a.plan->algorithm == AllreducePlan::Algorithm::kHierarchical) {
    if (!hierarchical_) {
      hierarchical_ = std::make_unique<HierarchicalAllreduce>(fabric_, ops_, &comms_, rank_);
    }
    return hierarchical_->Run(a, type);
  }
  NcclComm* c = nullptr;
  HVDL_RETURN_IF_ERROR(Comm(a.ps, &c));
  ncclRedOp_t op = NcclOp(a.dtype, a.op);
  double post = a.postscale;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
  // The executor turns Average into Sum with postscale 1/size; NCCL can divide on the way.
  if (IsFloatingPoint(a.dtype) && a.op == ReduceOp::kSum && c->size > 1 &&
      post == 1.0 / c->size) {
    op = ncclAvg;
    post = 1.0;
  }
#endif
  if (a.count > 0) {
    HVDL_NCCL(ncclAllReduce(a.buf, a.buf, static_cast<size_t>(a.count), type, op, c->comm,
                            stream()));
  }
  if (post == 1.0) return Status::Ok();
  return ops_->ScaleCopy({{a.buf, a.buf, a.count}}, a.dtype, post);
}

Status NcclBackend::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& counts,
                               DataType dtype, int ps) {
  ncclDataType_t type;
  HVDL_RETURN_IF_ERROR(Type(dtype, &type));
  NcclComm* c = nullptr;
  HVDL_RETURN_IF_ERROR(Comm(ps, &c));
  const size_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> displ = Offsets(counts);
  const void* mine = send != nullptr ? send : At(recv, displ[static_cast<size_t>(c->rank)], esize);
  if (AllEqual(counts)) {
    if (counts.front() == 0) return Status::Ok();
    HVDL_NCCL(ncclAllGather(mine, recv, static_cast<size_t>(counts.front()), type, c->comm,
                            stream()));
    return Status::Ok();
  }
  // Uneven blocks: member m broadcasts its block into its place on every member.
  return Group(rank_, [&]() -> Status {
    for (int m = 0; m < c->size; ++m) {
      const size_t n = static_cast<size_t>(counts[static_cast<size_t>(m)]);
      if (n == 0) continue;  // the same on every member
      char* dst = At(recv, displ[static_cast<size_t>(m)], esize);
      HVDL_NCCL(ncclBroadcast(m == c->rank ? mine : dst, dst, n, type, m, c->comm, stream()));
    }
    return Status::Ok();
  });
}

Status NcclBackend::Broadcast(void* buf, int64_t count, DataType dtype, int root, int ps) {
  ncclDataType_t type;
  HVDL_RETURN_IF_ERROR(Type(dtype, &type));
  NcclComm* c = nullptr;
  HVDL_RETURN_IF_ERROR(Comm(ps, &c));
  if (count == 0) return Status::Ok();
  HVDL_NCCL(ncclBroadcast(buf, buf, static_cast<size_t>(count), type, root, c->comm, stream()));
  return Status::Ok();
}

Status NcclBackend::Alltoallv(const void* send, const std::vector<int64_t>& send_counts,
                              void* recv, const std::vector<int64_t>& recv_counts, DataType dtype,
                              int ps) {
  ncclDataType_t type;
  HVDL_RETURN_IF_ERROR(Type(dtype, &type));
  NcclComm* c = nullptr;
  HVDL_RETURN_IF_ERROR(Comm(ps, &c));
  const size_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> sdispl = Offsets(send_counts), rdispl = Offsets(recv_counts);
  const size_t me = static_cast<size_t>(c->rank);
  // This rank's own block: a device copy, queued before the exchange.
  HVDL_RETURN_IF_ERROR(ops_->ScaleCopy(
      {{At(recv, rdispl[me], esize), At(const_cast<void*>(send), sdispl[me], esize), send_counts[me]}},
      dtype, 1.0));
  return Group(rank_, [&]() -> Status {
    for (int m = 0; m < c->size; ++m) {
      const size_t k = static_cast<size_t>(m);
      if (k == me) continue;
      if (send_counts[k] > 0) {  // the peer posts the matching receive, also only if > 0
        HVDL_NCCL(ncclSend(At(const_cast<void*>(send), sdispl[k], esize),
                           static_cast<size_t>(send_counts[k]), type, m, c->comm, stream()));
      }
      if (recv_counts[k] > 0) {
        HVDL_NCCL(ncclRecv(At(recv, rdispl[k], esize), static_cast<size_t>(recv_counts[k]), type,
                           m, c->comm, stream()));
      }
    }
    return Status::Ok();
  });
}

Status NcclBackend::ReduceScatter(const void* send, void* recv,
                                  const std::vector<int64_t>& counts, DataType dtype,
                                  ReduceOp op, int ps) {
  ncclDataType_t type;
  HVDL_RETURN_IF_ERROR(Type(dtype, &type));
  NcclComm* c = nullptr;
  HVDL_RETURN_IF_ERROR(Comm(ps, &c));
  const ncclRedOp_t nop = NcclOp(dtype, op);
  if (AllEqual(counts)) {
    if (counts.front() == 0) return Status::Ok();
    HVDL_NCCL(ncclReduceScatter(send, recv, static_cast<size_t>(counts.front()), type, nop,
                                c->comm, stream()));
    return Status::Ok();
  }
  // Uneven blocks: one reduction per member, rooted at the member that keeps the block.
  const size_t esize = DataTypeSize(dtype);
  const std::vector<int64_t> displ = Offsets(counts);
  return Group(rank_, [&]() -> Status {
    for (int m = 0; m < c->size; ++m) {
      const size_t n = static_cast<size_t>(counts[static_cast<size_t>(m)]);
      if (n == 0) continue;
      const void* src = At(const_cast<void*>(send), displ[static_cast<size_t>(m)], esize);
      HVDL_NCCL(ncclReduce(src, m == c->rank ? recv : nullptr, n, type, nop, m, c->comm,
                           stream()));
    }
    return Status::Ok();
  });
}

Status NcclBackend::WaitForDevice(DeviceEvent* event) { return comms_.Wait(event); }

Status NcclBackend::CheckAsync() { return comms_.CheckAsyncErrors(); }

void NcclBackend::AbortDevice() { comms_.AbortAll(); }

}  // namespace hvdl
