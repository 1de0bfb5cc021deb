// horovodlite._testing: one member of a shared-memory group per process (shm_member), for tests
// and benchmarks that start real processes (tests/unit/test_shm.py, benchmarks/shm_transport.py).
//
// job = {name, rank, size, plane: "transport" | "control", action, iterations, bytes,
//        single_copy, peer, timeout_ms, ready_file}; actions:
//   transport: pingpong (members 0 and 1 bounce `bytes`), bandwidth (0 streams `bytes`-byte
//              messages to 1, which acknowledges the last), allreduce (ring over `bytes` of
//              float64, checked), wait_recv (waits for a message from `peer` that never comes);
//   control:   bor (rounds of bitwise OR, checked), gather (gather + broadcast, checked),
//              wait_bor (a round some member never starts), wait_gather (member 0 gathers);
//   either:    hang (attach, create `ready_file`, sleep a minute: the member a test kills).
// Returns {error, seconds (the action's wall time), per_op_us, gbps}.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "backends/shm/shm_control_plane.h"
#include "backends/shm/shm_transport.h"
#include "comm/ring.h"
#include "comm/single_copy_transport.h"

namespace py = pybind11;

namespace hvdl {
namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  std::string name, plane, action, ready_file;
  int rank = 0, size = 1, iterations = 1, peer = 0, timeout_ms = 10000;
  int64_t bytes = 4;
  bool single_copy = false;
};

Status Both(Transport* t, std::vector<char>* buf, int peer, bool send_first) {
  int req;
  const int64_t n = static_cast<int64_t>(buf->size());
  for (int k = 0; k < 2; ++k) {
    if ((k == 0) == send_first) {
      HVDL_RETURN_IF_ERROR(t->PostSend({Span{buf->data(), n}}, 1, peer, 0, &req));
    } else {
      HVDL_RETURN_IF_ERROR(t->PostRecv({Span{buf->data(), n}}, 1, peer, 0, &req));
    }
    HVDL_RETURN_IF_ERROR(t->Wait(req));
  }
  return Status::Ok();
}

double MicrosPer(Clock::time_point start, int count) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
         std::max(1, count);
}

// Members 0 and 1 bounce `bytes` back and forth; the time per round trip after a warm-up.
Status PingPong(const Job& job, Transport* t, double* per_op_us) {
  if (job.rank > 1) return Status::Ok();
  std::vector<char> buf(static_cast<size_t>(job.bytes), 1);
  const int warmup = std::max(1, job.iterations / 10);
  Clock::time_point start;
  for (int i = 0; i < warmup + job.iterations; ++i) {
    if (i == warmup) start = Clock::now();
    HVDL_RETURN_IF_ERROR(Both(t, &buf, 1 - job.rank, job.rank == 0));
  }
  *per_op_us = MicrosPer(start, job.iterations);
  return Status::Ok();
}

// Member 0 streams `iterations` messages of `bytes` to member 1, which acknowledges the last;
// one message first to warm up.
Status Bandwidth(const Job& job, Transport* t, double* per_op_us, double* gbps) {
  if (job.rank > 1) return Status::Ok();
  std::vector<char> buf(static_cast<size_t>(job.bytes), 1);
  const bool sender = job.rank == 0;
  char ack = 0;
  int req;
  for (int round = 0; round < 2; ++round) {
    const auto start = Clock::now();
    const int count = round == 0 ? 1 : job.iterations;
    for (int i = 0; i < count; ++i) {
      HVDL_RETURN_IF_ERROR(sender ? t->Isend(buf.data(), buf.size(), 1, &req)
                                  : t->Irecv(buf.data(), buf.size(), 0, &req));
      HVDL_RETURN_IF_ERROR(t->Wait(req));
    }
    HVDL_RETURN_IF_ERROR(sender ? t->Irecv(&ack, 1, 1, &req) : t->Isend(&ack, 1, 0, &req));
    HVDL_RETURN_IF_ERROR(t->Wait(req));
    *per_op_us = MicrosPer(start, count);
    *gbps = static_cast<double>(job.bytes) / (*per_op_us * 1e3);
  }
  return Status::Ok();
}

// Ring allreduce (sum) of `bytes` of float64 over every member, checked every iteration.
Status Allreduce(const Job& job, Transport* t, double* per_op_us) {
  const int64_t count = job.bytes / 8;
  const int warmup = std::max(1, job.iterations / 10);
  std::vector<double> x(static_cast<size_t>(count));
  const auto chunks = EvenChunks(count, job.size);
  Clock::time_point start;
  for (int it = 0; it < warmup + job.iterations; ++it) {
    if (it == warmup) start = Clock::now();
    for (int64_t i = 0; i < count; ++i) x[static_cast<size_t>(i)] = job.rank + 1 + i % 7;
    HVDL_RETURN_IF_ERROR(RingAllreduce(t, ContiguousChunks(x.data(), chunks, DataType::kFloat64),
                                       DataType::kFloat64, ReduceOp::kSum, 1.0, 1 << 20,
                                       nullptr));
    for (int64_t i = 0; i < count; ++i) {
      const double want = job.size * (job.size + 1) / 2.0 + job.size * (i % 7);
      if (x[static_cast<size_t>(i)] != want) {
        return Status::Internal("allreduce: element " + std::to_string(i) + " is " +
                                std::to_string(x[static_cast<size_t>(i)]) + ", expected " +
                                std::to_string(want));
      }
    }
  }
  *per_op_us = MicrosPer(start, job.iterations);
  return Status::Ok();
}

Status TransportAction(const Job& job, Transport* t, double* per_op_us, double* gbps) {
  if (job.action == "pingpong") return PingPong(job, t, per_op_us);
  if (job.action == "bandwidth") return Bandwidth(job, t, per_op_us, gbps);
  if (job.action == "allreduce") return Allreduce(job, t, per_op_us);
  if (job.action == "wait_recv") {
    char byte;
    int req;
    HVDL_RETURN_IF_ERROR(t->Irecv(&byte, 1, job.peer, &req));
    return t->Wait(req);
  }
  return Status::InvalidArgument("unknown transport action " + job.action);
}

Status ControlAction(const Job& job, ShmControlPlane* cp, double* per_op_us) {
  const int me = job.rank;
  if (job.action == "bor" || job.action == "wait_bor") {
    const bool forever = job.action == "wait_bor";
    const auto start = Clock::now();
    for (int it = 0; it < job.iterations; ++it) {
      uint64_t words[3] = {uint64_t{1} << me, static_cast<uint64_t>(it), ~uint64_t{0} << me};
      bool done = false;
      HVDL_RETURN_IF_ERROR(cp->StartBitwiseOr(words, 3));
      while (!done) {
        HVDL_RETURN_IF_ERROR(cp->TestBitwiseOr(&done));
        // Between tests: yield the core (more members than cores must still progress), or,
        // waiting for a member that never comes, sleep like the background loop does.
        if (!done && forever) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!done && !forever) std::this_thread::yield();
      }
      const uint64_t all = (uint64_t{1} << job.size) - 1;
      if (words[0] != all || words[1] != static_cast<uint64_t>(it) || words[2] != ~uint64_t{0}) {
        return Status::Internal("bitwise OR round " + std::to_string(it) + ": wrong result");
      }
    }
    *per_op_us = MicrosPer(start, job.iterations);
    return Status::Ok();
  }
  if (job.action == "gather" || job.action == "wait_gather") {
    const auto start = Clock::now();
    for (int it = 0; it < job.iterations; ++it) {
      std::vector<std::string> all;
      auto part = [&](int m) { return std::string(static_cast<size_t>((m + it) % 64), 'a' + m); };
      HVDL_RETURN_IF_ERROR(cp->Gather(part(me), &all));
      for (int m = 0; me == 0 && m < job.size; ++m) {
        if (all[static_cast<size_t>(m)] != part(m)) {
          return Status::Internal("gather: wrong contribution of member " + std::to_string(m));
        }
      }
      if (job.action == "wait_gather") return Status::Ok();
      const std::string sent(static_cast<size_t>(it % 8 * 1000), 'z');  // up to 7000 bytes
      std::string data = me == 0 ? sent : "";
      HVDL_RETURN_IF_ERROR(cp->Broadcast(&data));
      if (data != sent) {
        return Status::Internal("broadcast: wrong data");
      }
    }
    *per_op_us = MicrosPer(start, job.iterations);
    return Status::Ok();
  }
  return Status::InvalidArgument("unknown control action " + job.action);
}

Status RunMember(const Job& job, double* per_op_us, double* gbps) {
  ShmGroupOptions o = job.plane == "control" ? ShmControlPlane::GroupOptions(16)
                                             : ShmGroupOptions();
  o.timeout = std::chrono::milliseconds(job.timeout_ms);
  for (int m = 0; m < job.size; ++m) o.names.push_back("rank " + std::to_string(m));
  std::shared_ptr<ShmGroup> g;
  HVDL_RETURN_IF_ERROR(ShmGroup::Attach(job.name, job.rank, job.size, o, &g));
  if (job.action == "hang") {
    std::ofstream(job.ready_file) << "attached\n";
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return Status::Ok();
  }
  if (job.plane == "control") {
    ShmControlPlane cp(g);
    return ControlAction(job, &cp, per_op_us);
  }
  std::unique_ptr<Transport> t = std::make_unique<ShmTransport>(g);
  if (job.single_copy) {
    t = std::make_unique<SingleCopyTransport>(
        std::move(t), std::vector<std::string>(static_cast<size_t>(job.size), "host"));
  }
  return TransportAction(job, t.get(), per_op_us, gbps);
}

}  // namespace

py::dict ShmMember(const py::dict& d) {
  Job job;
  job.name = d["name"].cast<std::string>();
  job.rank = d["rank"].cast<int>();
  job.size = d["size"].cast<int>();
  job.plane = d.contains("plane") ? d["plane"].cast<std::string>() : "transport";
  job.action = d["action"].cast<std::string>();
  if (d.contains("iterations")) job.iterations = d["iterations"].cast<int>();
  if (d.contains("bytes")) job.bytes = d["bytes"].cast<int64_t>();
  if (d.contains("single_copy")) job.single_copy = d["single_copy"].cast<bool>();
  if (d.contains("peer")) job.peer = d["peer"].cast<int>();
  if (d.contains("timeout_ms")) job.timeout_ms = d["timeout_ms"].cast<int>();
  if (d.contains("ready_file")) job.ready_file = d["ready_file"].cast<std::string>();
  double per_op_us = 0, gbps = 0;
  const auto start = Clock::now();
  Status s;
  {
    py::gil_scoped_release nogil;
    s = RunMember(job, &per_op_us, &gbps);
  }
  py::dict out;
  out["error"] = s.message();
  out["code"] = static_cast<int>(s.code());
  out["seconds"] = std::chrono::duration<double>(Clock::now() - start).count();
  out["per_op_us"] = per_op_us;
  out["gbps"] = gbps;
  return out;
}

}  // namespace hvdl
