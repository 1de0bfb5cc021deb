// horovodlite._testing, communication part: the transport collectives and the single-copy layer
// run by N rank threads over LocalTransports or ShmTransports, and the allreduce planner's
// decisions for a described launch - all without MPI.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <thread>

#include "comm/allreduce_planner.h"
#include "comm/host_collectives.h"
#include "comm/ring.h"
#include "comm/single_copy_transport.h"
#include "comm/transport_collectives.h"
#include "common/errors.h"
#include "testing/local_transport.h"
#include "testing/thread_backend.h"

namespace py = pybind11;

namespace hvdl {
// testing/testing_shm.cc: member `rank` of `size` of a fresh shared-memory group of this call.
Status NewShmTestTransport(const std::string& segment, int rank, int size,
                           std::unique_ptr<Transport>* out);
std::string NewShmTestName(const std::string& what);
namespace {

// Every rank's output of one collective over the transports (`transport`: "local", the
// in-process LocalTransport, or "shm", a ShmTransport per rank thread over one shared-memory
// segment); `hosts` non-empty: the single-copy layer on top, pairing the ranks of one pretend
// host. out[r] = (rank r's result, its single-copy peers). "allreduce" is the ring over the
// contiguous buffer split evenly.
py::list TransportCollective(const std::string& op, const std::vector<std::string>& inputs,
                             const std::vector<std::vector<int64_t>>& counts, int dtype, int root,
                             int reduce_op, const std::vector<std::string>& hosts,
                             int64_t segment, const std::string& transport) {
  const int n = static_cast<int>(inputs.size());
  const auto dt = static_cast<DataType>(dtype);
  const size_t esize = DataTypeSize(dt);
  auto boxes = std::make_shared<LocalMailboxes>(n);
  const std::string segment_name = NewShmTestName("collective");
  std::vector<std::string> outputs(static_cast<size_t>(n));
  std::vector<int> peers(static_cast<size_t>(n), 0);
  std::vector<std::string> errors(static_cast<size_t>(n));
  auto total = [](const std::vector<int64_t>& c) {
    int64_t t = 0;
    for (int64_t x : c) t += x;
    return t;
  };
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const size_t me = static_cast<size_t>(r);
        std::unique_ptr<Transport> t;
        if (transport == "shm") {
          Status attached = NewShmTestTransport(segment_name, r, n, &t);
          if (!attached.ok()) {
            errors[me] = attached.message();
            return;
          }
        } else {
          t = std::make_unique<LocalTransport>(boxes, r);
        }
        if (!hosts.empty()) t = std::make_unique<SingleCopyTransport>(std::move(t), hosts);
        peers[me] = t->single_copy_peers();
        std::string& out = outputs[me];
        const std::string& in = inputs[me];
        Status s;
        if (op == "allreduce") {
          out = in;
          const auto chunks = EvenChunks(static_cast<int64_t>(in.size() / esize), n);
          s = RingAllreduce(t.get(), ContiguousChunks(out.data(), chunks, dt), dt,
                            static_cast<ReduceOp>(reduce_op), 1.0, static_cast<size_t>(segment),
                            nullptr);
        } else if (op == "allgather") {
          out.assign(static_cast<size_t>(total(counts[0])) * esize, '\0');
          s = TransportAllgatherv(t.get(), in.data(), out.data(), counts[0], dt,
                                  static_cast<size_t>(segment));
        } else if (op == "reducescatter") {
          out.assign(static_cast<size_t>(counts[0][me]) * esize, '\0');
          s = TransportReduceScatter(t.get(), in.data(), out.data(), counts[0], dt,
                                     static_cast<ReduceOp>(reduce_op),
                                     static_cast<size_t>(segment));
        } else if (op == "reducescatter_inplace") {  // on a scratch copy, which it reduces
          std::string work = in;
          out.assign(static_cast<size_t>(counts[0][me]) * esize, '\0');
          s = TransportReduceScatterInPlace(t.get(), work.data(), out.data(), counts[0], dt,
                                            static_cast<ReduceOp>(reduce_op),
                                            static_cast<size_t>(segment));
        } else if (op == "broadcast") {
          out = in;
          s = TransportBroadcast(t.get(), out.data(), static_cast<int64_t>(in.size() / esize), dt,
                                 root);
        } else if (op == "alltoall") {  // counts[r] = what rank r sends to each
          std::vector<int64_t> recv(static_cast<size_t>(n));
          for (int q = 0; q < n; ++q) {
            recv[static_cast<size_t>(q)] = counts[static_cast<size_t>(q)][me];
          }
          out.assign(static_cast<size_t>(total(recv)) * esize, '\0');
          s = TransportAlltoallv(t.get(), in.data(), counts[me], out.data(), recv, dt);
        } else {
          s = Status::InvalidArgument(
              "op: allreduce, allgather, reducescatter, reducescatter_inplace, broadcast or "
              "alltoall");
        }
        errors[me] = s.message();
      });
    }
    for (auto& th : threads) th.join();
  }
  py::list result;
  for (int r = 0; r < n; ++r) {
    if (!errors[static_cast<size_t>(r)].empty()) {
      ThrowIfError(Status::Internal("rank " + std::to_string(r) + ": " +
                                    errors[static_cast<size_t>(r)]));
    }
    result.append(py::make_tuple(py::bytes(outputs[static_cast<size_t>(r)]),
                                 peers[static_cast<size_t>(r)]));
  }
  return result;
}

// A Fabric that only describes a launch (the planner asks no more of it).
class DescribedFabric : public Fabric {
 public:
  explicit DescribedFabric(const py::dict& d)
      : hierarchical_(d.contains("hierarchical") && d["hierarchical"].cast<bool>()),
        spans_hosts_(d.contains("spans_hosts") && d["spans_hosts"].cast<bool>()),
        homogeneous_(!d.contains("homogeneous") || d["homogeneous"].cast<bool>()),
        rank_(d.contains("rank") ? d["rank"].cast<int>() : 1) {}
  Status AddProcessSet(int, const std::vector<int>&) override { return Status::Ok(); }
  Status RemoveProcessSet(int) override { return Status::Ok(); }
  int SetSize(int) const override { return 2; }
  int SetRank(int) const override { return rank_; }
  Status SetTransport(int, Transport**) override { return Status::Internal("described only"); }
  bool hierarchical() const override { return hierarchical_; }
  bool spans_hosts() const override { return spans_hosts_; }
  bool homogeneous() const override { return homogeneous_; }
  Status HostTransports(Transport**, Transport**) override {
    return Status::Internal("described only");
  }
  Status Meet(int) override { return Status::Ok(); }
  int single_copy_transports() const override { return 0; }
  int single_copy_peers() const override { return 0; }

 private:
  bool hierarchical_, spans_hosts_, homogeneous_;
  int rank_;
};

// A device backend that says it is NCCL (the planner's device decisions).
class NamedDeviceBackend : public ThreadBackend {
 public:
  NamedDeviceBackend(bool nccl)
      : ThreadBackend(std::make_shared<ThreadFabric>(1), 0, true), nccl_(nccl) {}
  const char* name() const override { return nccl_ ? "nccl" : "host-staged"; }
  bool native_device() const override { return nccl_; }

 private:
  bool nccl_;
};

// The planner's decision for `query` (bytes, tensors, dtype, op, prescale, postscale, ps, device,
// set_size) under the HOROVOD_* variables `env`, in a launch `fabric` describes (hierarchical,
// spans_hosts, homogeneous; "none": no fabric) with a device backend that is NCCL or not.
py::dict PlanAllreduce(const std::map<std::string, std::string>& env, const py::dict& fabric,
                       const py::dict& query, bool nccl) {
  Config config;
  ThrowIfError(ParseConfig(
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      &config));
  const bool none = fabric.contains("none") && fabric["none"].cast<bool>();
  DescribedFabric described(fabric);
  Fabric* f = none ? nullptr : &described;
  BackendRegistry registry;
  auto host = std::make_unique<HostCollectives>(&described, nullptr);
  if (none) {
    registry.Add(std::make_unique<ThreadBackend>(std::make_shared<ThreadFabric>(1), 0, false));
  } else {
    registry.Add(std::move(host));
  }
  registry.Add(std::make_unique<NamedDeviceBackend>(nccl));
  AllreducePlanner planner(config, f, &registry);
  AllreduceQuery q;
  auto get = [&](const char* k, auto fallback) {
    return query.contains(k) ? query[k].cast<decltype(fallback)>() : fallback;
  };
  q.bytes = get("bytes", int64_t{4});
  q.tensors = get("tensors", 1);
  q.dtype = static_cast<DataType>(get("dtype", static_cast<int>(DataType::kFloat32)));
  q.op = static_cast<ReduceOp>(get("op", static_cast<int>(ReduceOp::kSum)));
  q.prescale = get("prescale", 1.0);
  q.postscale = get("postscale", 1.0);
  q.ps = get("ps", 0);
  q.device = get("device", static_cast<int>(kCpuDevice));
  q.set_size = get("set_size", 2);
  AllreducePlan plan;
  ThrowIfError(planner.Plan(q, &plan));
  const char* algorithms[] = {"native", "ring", "hierarchical"};
  py::dict d;
  d["algorithm"] = algorithms[static_cast<int>(plan.algorithm)];
  d["backend"] = plan.backend->name();
  d["spans"] = plan.spans;
  d["op"] = static_cast<int>(plan.op);
  d["prescale"] = plan.prescale;
  d["postscale"] = plan.postscale;
  d["segment_bytes"] = plan.segment_bytes;
  d["cross_segment_bytes"] = plan.cross_segment_bytes;
  d["activity"] = plan.activity;
  return d;
}

}  // namespace

void RegisterCommTesting(py::module_& m) {
  m.def("transport_collective", &TransportCollective, py::arg("op"), py::arg("inputs"),
        py::arg("counts") = std::vector<std::vector<int64_t>>(), py::arg("dtype") = 7,
        py::arg("root") = 0, py::arg("reduce_op") = 1,
        py::arg("hosts") = std::vector<std::string>(), py::arg("segment") = 64,
        py::arg("transport") = "local");
  m.def("plan_allreduce", &PlanAllreduce, py::arg("env"), py::arg("fabric"), py::arg("query"),
        py::arg("nccl") = false);
}

}  // namespace hvdl
