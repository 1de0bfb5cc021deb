// horovodlite._testing: bindings that exercise core pieces without MPI, for tests/unit only. It is
// its own extension module, built on demand for the tests (CMake target _testing, not part of
// the default build or of a wheel; tests/cpp.py builds and imports it). The negotiation
// and the ring run N ranks as threads over the in-process control plane and transport.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <thread>

#include <unistd.h>

#include "comm/hierarchical.h"
#include "comm/reduce_kernels.h"
#include "comm/ring.h"
#include "comm/single_copy.h"
#include "common/config.h"
#include "common/errors.h"
#include "core/affinity.h"
#include "core/controller.h"
#include "core/fusion.h"
#include "core/message.h"
#include "testing/local_control_plane.h"
#include "testing/local_transport.h"

namespace py = pybind11;

namespace hvdl {
void RegisterDeviceTesting(py::module_& m);  // testing/testing_device.cc
void RegisterCommTesting(py::module_& m);    // testing/testing_comm.cc
void RegisterShmTesting(py::module_& m);     // testing/testing_shm.cc
void RegisterHandleTesting(py::module_& m);  // testing/testing_handles.cc
void RegisterScaleTesting(py::module_& m);   // testing/testing_scale.cc
void RegisterFaultTesting(py::module_& m);   // testing/testing_faults.cc
void RegisterNoticeTesting(py::module_& m);  // testing/testing_notices.cc
void RegisterStreamFailureTesting(py::module_& m);  // testing/testing_stream_failure.cc
void RegisterQueueTesting(py::module_& m);   // testing/testing_queue.cc
void RegisterMpiTesting(py::module_& m);     // testing/testing_mpi.cc
namespace {

template <typename T>
T Get(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

Request ToRequest(const py::dict& d) {
  Request q;
  q.op = static_cast<OpType>(Get<int>(d, "op", 0));
  q.name = d["name"].cast<std::string>();
  q.dtype = static_cast<DataType>(Get<int>(d, "dtype", static_cast<int>(DataType::kFloat32)));
  q.shape = Get<std::vector<int64_t>>(d, "shape", {4});
  q.reduce_op = static_cast<ReduceOp>(Get<int>(d, "reduce_op", 1));
  q.prescale = Get<double>(d, "prescale", 1.0);
  q.postscale = Get<double>(d, "postscale", 1.0);
  q.root = Get<int>(d, "root", -1);
  q.process_set = Get<int>(d, "process_set", 0);
  q.device = Get<int>(d, "device", kCpuDevice);
  q.splits = Get<std::vector<int64_t>>(d, "splits", {});
  q.site = Get<std::string>(d, "site", "");
  return q;
}

py::dict FromResponse(const Response& r) {
  py::dict d;
  d["op"] = static_cast<int>(r.op);
  d["name"] = r.name;
  d["error"] = r.error;
  d["shape"] = r.shape;
  d["sizes"] = r.sizes;
  d["process_set"] = r.process_set;
  return d;
}

// script[cycle][rank] = list of request dicts submitted by `rank` before `cycle`.
// Returns (responses[cycle][rank] = list of dicts, stats[rank] = dict).
py::tuple Negotiate(int nranks, const std::vector<std::vector<py::list>>& script,
                    size_t cache_capacity, const std::vector<std::vector<int>>& sets) {
  std::vector<std::vector<std::vector<Request>>> input(script.size());
  for (size_t c = 0; c < script.size(); ++c) {
    for (const py::list& reqs : script[c]) {
      input[c].emplace_back();
      for (const auto& item : reqs) input[c].back().push_back(ToRequest(item.cast<py::dict>()));
    }
  }
  auto fabric = std::make_shared<LocalFabric>(nranks);
  std::vector<std::vector<std::vector<Response>>> out(script.size(),
                                                      std::vector<std::vector<Response>>(nranks));
  std::vector<ControllerStats> stats(static_cast<size_t>(nranks));
  std::vector<std::string> errors(static_cast<size_t>(nranks));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; ++r) {
      threads.emplace_back([&, r] {
        LocalControlPlane cp(fabric, r);
        ProcessSetTable table(nranks);
        for (size_t i = 0; i < sets.size(); ++i) table.Add(static_cast<int>(i) + 1, sets[i]);
        Controller ctl(&cp, &table, cache_capacity);
        for (size_t c = 0; c < input.size(); ++c) {
          ctl.Submit(input[c][static_cast<size_t>(r)]);
          Status s = ctl.StartCycle();
          bool done = false;
          while (s.ok() && !done) s = ctl.TestCycle(&done);
          CycleResult result;
          if (s.ok()) s = ctl.FinishCycle(&result);
          if (!s.ok()) {
            errors[static_cast<size_t>(r)] = s.message();
            return;
          }
          out[c][static_cast<size_t>(r)] = result.responses;
        }
        stats[static_cast<size_t>(r)] = ctl.stats();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const std::string& e : errors) {
    if (!e.empty()) throw InternalError(e);
  }
  py::list cycles;
  for (auto& per_rank : out) {
    py::list ranks;
    for (auto& responses : per_rank) {
      py::list lst;
      for (const Response& r : responses) lst.append(FromResponse(r));
      ranks.append(lst);
    }
    cycles.append(ranks);
  }
  py::list st;
  for (const ControllerStats& s : stats) {
    py::dict d;
    d["cycles"] = s.cycles;
    d["negotiations"] = s.negotiations;
    d["cache_hits"] = s.cache_hits;
    d["invalidations"] = s.invalidations;
    st.append(d);
  }
  return py::make_tuple(cycles, st);
}

std::vector<py::bytes> Ring(const std::vector<std::string>& inputs, int dtype, int op,
                            std::vector<int64_t> chunks, double postscale, size_t segment) {
  const int n = static_cast<int>(inputs.size());
  std::vector<std::string> bufs = inputs;
  const int64_t count =
      static_cast<int64_t>(bufs[0].size() / DataTypeSize(static_cast<DataType>(dtype)));
  if (chunks.empty()) chunks = EvenChunks(count, n);
  auto boxes = std::make_shared<LocalMailboxes>(n);
  std::vector<std::string> errors(static_cast<size_t>(n));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        LocalTransport t(boxes, r);
        auto spans = ContiguousChunks(bufs[static_cast<size_t>(r)].data(), chunks,
                                      static_cast<DataType>(dtype));
        Status s = RingAllreduce(&t, spans, static_cast<DataType>(dtype),
                                 static_cast<ReduceOp>(op), postscale, segment, nullptr);
        if (!s.ok()) errors[static_cast<size_t>(r)] = s.message();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const std::string& e : errors) {
    if (!e.empty()) throw InternalError(e);
  }
  return std::vector<py::bytes>(bufs.begin(), bufs.end());
}

// Hierarchical allreduce of `hosts` x `per_host` rank threads: rank r = host * per_host + local
// (as placed by slot), inputs[r] its buffer; `chunks` as for Ring (default: even over all ranks).
std::vector<py::bytes> Hierarchical(const std::vector<std::string>& inputs, int hosts, int dtype,
                                    int op, std::vector<int64_t> chunks, double postscale,
                                    size_t segment) {
  const int n = static_cast<int>(inputs.size());
  if (hosts < 1 || n % hosts != 0) throw py::value_error("ranks must be hosts x per_host");
  const int per_host = n / hosts;
  std::vector<std::string> bufs = inputs;
  const auto dt = static_cast<DataType>(dtype);
  const int64_t count = static_cast<int64_t>(bufs[0].size() / DataTypeSize(dt));
  if (chunks.empty()) chunks = EvenChunks(count, n);
  std::vector<std::shared_ptr<LocalMailboxes>> local_boxes, cross_boxes;
  for (int h = 0; h < hosts; ++h) local_boxes.push_back(std::make_shared<LocalMailboxes>(per_host));
  for (int l = 0; l < per_host; ++l) cross_boxes.push_back(std::make_shared<LocalMailboxes>(hosts));
  std::vector<std::string> errors(static_cast<size_t>(n));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const int h = r / per_host, l = r % per_host;
        LocalTransport local(local_boxes[static_cast<size_t>(h)], l);
        LocalTransport cross(cross_boxes[static_cast<size_t>(l)], h);
        auto spans = ContiguousChunks(bufs[static_cast<size_t>(r)].data(), chunks, dt);
        Status s = HierarchicalAllreduce(&local, &cross, spans, dt, static_cast<ReduceOp>(op),
                                         postscale, segment, segment, nullptr);
        if (!s.ok()) errors[static_cast<size_t>(r)] = s.message();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const std::string& e : errors) {
    if (!e.empty()) throw InternalError(e);
  }
  return std::vector<py::bytes>(bufs.begin(), bufs.end());
}

// HierarchicalAllgatherv (`inputs[r]`: rank r's block of bytes; returns what each gathered) or,
// with `reduce`, HierarchicalReduceScatter (`inputs[r]`: rank r's float32 data for every block,
// `counts` floats per rank; returns each rank's summed block) among rank threads placed by
// `hosts` (hosts[h]: host h's ranks in local order, every host alike; ranks need not be
// contiguous).
std::vector<py::bytes> HierarchicalGather(const std::vector<std::string>& inputs,
                                          const std::vector<std::vector<int>>& hosts,
                                          size_t segment, bool reduce,
                                          std::vector<int64_t> counts) {
  const int n = static_cast<int>(inputs.size());
  const size_t per_host = hosts.at(0).size();
  std::vector<std::vector<int>> columns(per_host);
  std::vector<int> host_of(static_cast<size_t>(n)), local_of(static_cast<size_t>(n));
  for (size_t h = 0; h < hosts.size(); ++h) {
    if (hosts[h].size() != per_host) throw py::value_error("every host needs as many ranks");
    for (size_t l = 0; l < per_host; ++l) {
      const int r = hosts[h][l];
      host_of.at(static_cast<size_t>(r)) = static_cast<int>(h);
      local_of.at(static_cast<size_t>(r)) = static_cast<int>(l);
      columns[l].push_back(r);
    }
  }
  for (auto& c : columns) std::sort(c.begin(), c.end());  // Fabric::LocalRankColumns' order
  if (!reduce) {
    counts.clear();
    for (const std::string& b : inputs) counts.push_back(static_cast<int64_t>(b.size()));
  }
  if (counts.size() != static_cast<size_t>(n)) throw py::value_error("a count per rank");
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<std::string> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    out[static_cast<size_t>(r)].assign(
        static_cast<size_t>(reduce ? counts[static_cast<size_t>(r)] * 4 : total), '?');
  }
  std::vector<std::shared_ptr<LocalMailboxes>> local_boxes, cross_boxes;
  for (size_t h = 0; h < hosts.size(); ++h) {
    local_boxes.push_back(std::make_shared<LocalMailboxes>(static_cast<int>(per_host)));
  }
  for (size_t l = 0; l < per_host; ++l) {
    cross_boxes.push_back(std::make_shared<LocalMailboxes>(static_cast<int>(hosts.size())));
  }
  std::vector<std::string> errors(static_cast<size_t>(n));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const size_t l = static_cast<size_t>(local_of[static_cast<size_t>(r)]);
        const auto& column = columns[l];
        const int cross_rank =
            static_cast<int>(std::find(column.begin(), column.end(), r) - column.begin());
        LocalTransport local(local_boxes[static_cast<size_t>(host_of[static_cast<size_t>(r)])],
                             static_cast<int>(l));
        LocalTransport cross(cross_boxes[l], cross_rank);
        const char* in = inputs[static_cast<size_t>(r)].data();
        char* to = out[static_cast<size_t>(r)].data();
        Status s = reduce ? HierarchicalReduceScatter(&local, &cross, in, to, counts,
                                                      DataType::kFloat32, ReduceOp::kSum, columns,
                                                      segment, segment)
                          : HierarchicalAllgatherv(&local, &cross, in, to, counts,
                                                   DataType::kUInt8, columns, segment, segment);
        if (!s.ok()) errors[static_cast<size_t>(r)] = s.message();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const std::string& e : errors) {
    if (!e.empty()) throw InternalError(e);
  }
  return std::vector<py::bytes>(out.begin(), out.end());
}

py::bytes Reduce(std::string dst, const std::string& src, int dtype, int op) {
  auto dt = static_cast<DataType>(dtype);
  ReduceInto(dst.data(), src.data(), static_cast<int64_t>(dst.size() / DataTypeSize(dt)), dt,
             static_cast<ReduceOp>(op));
  return py::bytes(dst);
}

py::bytes ReduceScaleBytes(std::string dst, const std::string& src, int dtype, int op,
                           double factor) {
  auto dt = static_cast<DataType>(dtype);
  ReduceScaleInto(dst.data(), src.data(), static_cast<int64_t>(dst.size() / DataTypeSize(dt)),
                  dt, static_cast<ReduceOp>(op), factor);
  return py::bytes(dst);
}

py::bytes ScaleBytes(std::string buf, int dtype, double factor) {
  auto dt = static_cast<DataType>(dtype);
  Scale(buf.data(), static_cast<int64_t>(buf.size() / DataTypeSize(dt)), dt, factor);
  return py::bytes(buf);
}

py::dict ParseEnv(const std::map<std::string, std::string>& env) {
  Config c;
  ThrowIfError(ParseConfig(
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      },
      &c));
  py::dict d;
  d["fusion_threshold_bytes"] = c.fusion_threshold_bytes;
  d["cycle_time_ms"] = c.cycle_time_ms;
  d["cache_capacity"] = c.cache_capacity;
  d["log_level"] = LogLevelName(c.log_level);
  d["stall_check_seconds"] = c.stall_check_seconds;
  d["stall_shutdown_seconds"] = c.stall_shutdown_seconds;
  d["autotune"] = c.autotune;
  d["allreduce_algorithm"] = AllreduceAlgorithmName(c.allreduce_algorithm);
  d["timeline"] = c.timeline_path;
  const char* toggles[] = {"auto", "off", "on"};
  d["hierarchical_allreduce"] = toggles[static_cast<int>(c.hierarchical_allreduce)];
  d["hierarchical_allgather"] = toggles[static_cast<int>(c.hierarchical_allgather)];
  d["staging_chunk_bytes"] = c.staging_chunk_bytes;
  d["gpu_completion"] = c.gpu_stream_completion ? "stream" : "host";
  return d;
}

// Plans fusion for responses given as dicts (op, dtype, bytes, reduce_op, process_set).
std::vector<std::vector<size_t>> Plan(const std::vector<py::dict>& items, int64_t threshold) {
  std::vector<Response> responses;
  std::vector<int64_t> bytes;
  for (const py::dict& d : items) {
    Response r;
    r.op = static_cast<OpType>(Get<int>(d, "op", 0));
    r.dtype = static_cast<DataType>(Get<int>(d, "dtype", static_cast<int>(DataType::kFloat32)));
    r.reduce_op = static_cast<ReduceOp>(Get<int>(d, "reduce_op", 1));
    r.process_set = Get<int>(d, "process_set", 0);
    responses.push_back(r);
    bytes.push_back(Get<int64_t>(d, "bytes", 4));
  }
  std::vector<const Response*> ptrs;
  for (const Response& r : responses) ptrs.push_back(&r);
  std::vector<std::vector<size_t>> out;
  for (const Batch& b : PlanBatches(ptrs, threshold, bytes)) out.push_back(b.members);
  return out;
}

py::list RoundTrip(const std::vector<py::dict>& reqs) {
  std::vector<Request> in;
  for (const py::dict& d : reqs) in.push_back(ToRequest(d));
  std::vector<Request> back;
  ThrowIfError(ParseRequests(SerializeRequests(in), &back));
  py::list out;
  for (size_t i = 0; i < back.size(); ++i) out.append(back[i].SameSignature(in[i]) && back[i].site == in[i].site);
  return out;
}

// Splits `payload` into separately allocated pieces of `remote_sizes` bytes, reads them with
// ReadFromProcess (from `pid`, this process by default) into pieces of `local_sizes` bytes and
// returns what landed, concatenated.
py::bytes SingleCopyRead(const std::string& payload, const std::vector<int64_t>& remote_sizes,
                         const std::vector<int64_t>& local_sizes, int64_t pid) {
  std::vector<std::string> there, here;
  std::vector<Span> remote, local;
  size_t at = 0;
  for (int64_t n : remote_sizes) {
    there.push_back(payload.substr(std::min(at, payload.size()), static_cast<size_t>(n)));
    at += static_cast<size_t>(n);
  }
  for (int64_t n : local_sizes) here.emplace_back(static_cast<size_t>(n), '\0');
  for (std::string& s : there) remote.push_back({s.data(), static_cast<int64_t>(s.size())});
  for (std::string& s : here) local.push_back({s.data(), static_cast<int64_t>(s.size())});
  ThrowIfError(ReadFromProcess(pid < 0 ? getpid() : pid, local, remote));
  std::string out;
  for (const std::string& s : here) out += s;
  return py::bytes(out);
}

}  // namespace

// HorovodArgumentError / HorovodInternalError are _C's classes: the tests catch them as they
// catch the runtime's.
void RegisterErrors() {
  py::module_ c = py::module_::import("horovodlite._C");
  static py::object argument_error = c.attr("HorovodArgumentError");
  static py::object internal_error = c.attr("HorovodInternalError");
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      PyErr_SetString(argument_error.ptr(), e.what());
    } catch (const InternalError& e) {
      PyErr_SetString(internal_error.ptr(), e.what());
    }
  });
}

void RegisterTesting(py::module_& m) {
  RegisterErrors();
  m.def("choose_rank_cpu", [](const std::string& mode, const std::vector<int>& allowed,
                              int local_rank, int local_size) {
    Toggle t = mode == "auto" ? Toggle::kAuto : mode == "1" ? Toggle::kOn : Toggle::kOff;
    return ChooseRankCpu(t, allowed, local_rank, local_size);
  });
  m.def("negotiate", &Negotiate, py::arg("nranks"), py::arg("script"),
        py::arg("cache_capacity") = 1024, py::arg("process_sets") = std::vector<std::vector<int>>());
  m.def("ring_allreduce", &Ring, py::arg("inputs"), py::arg("dtype"), py::arg("op"),
        py::arg("chunks") = std::vector<int64_t>(), py::arg("postscale") = 1.0,
        py::arg("segment_bytes") = 64);
  m.def("hierarchical_allgather", [](const std::vector<std::string>& blocks,
                                     const std::vector<std::vector<int>>& hosts, size_t segment) {
    return HierarchicalGather(blocks, hosts, segment, false, {});
  }, py::arg("blocks"), py::arg("hosts"), py::arg("segment") = 64);
  m.def("hierarchical_reducescatter", [](const std::vector<std::string>& inputs,
                                         const std::vector<std::vector<int>>& hosts,
                                         const std::vector<int64_t>& counts, size_t segment) {
    return HierarchicalGather(inputs, hosts, segment, true, counts);
  }, py::arg("inputs"), py::arg("hosts"), py::arg("counts"), py::arg("segment") = 64);
  m.def("hierarchical_allreduce", &Hierarchical, py::arg("inputs"), py::arg("hosts"),
        py::arg("dtype"), py::arg("op"), py::arg("chunks") = std::vector<int64_t>(),
        py::arg("postscale") = 1.0, py::arg("segment") = 65536);
  m.def("reduce", &Reduce);
  m.def("scale", &ScaleBytes);
  m.def("reduce_scale", &ReduceScaleBytes);
  m.def("parse_config", &ParseEnv);
  m.def("plan_batches", &Plan);
  m.def("serialize_roundtrip", &RoundTrip);
  m.def("single_copy_read", &SingleCopyRead, py::arg("payload"), py::arg("remote_sizes"),
        py::arg("local_sizes"), py::arg("pid") = -1);
  m.def("single_copy_built", &SingleCopyBuilt);
  m.def("float_to_half", [](float f) { return FloatToHalf(f); });
  m.def("half_to_float", [](uint16_t h) { return HalfToFloat(h); });
  m.def("float_to_bfloat16", [](float f) { return FloatToBFloat16(f); });
  RegisterDeviceTesting(m);
  RegisterCommTesting(m);
  RegisterShmTesting(m);
  RegisterHandleTesting(m);
  RegisterQueueTesting(m);
  RegisterScaleTesting(m);
  RegisterFaultTesting(m);
  RegisterNoticeTesting(m);
  RegisterStreamFailureTesting(m);
  RegisterMpiTesting(m);
}

}  // namespace hvdl

PYBIND11_MODULE(_testing, m) {
  m.doc() = "horovodlite core pieces for unit tests (no MPI)";
  hvdl::RegisterTesting(m);
}
