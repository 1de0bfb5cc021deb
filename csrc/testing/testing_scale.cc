// The control plane at scale, simulated: N ranks as threads running the real Controller (the
// negotiation, the response cache's bit vector, the stall inspector) over LocalControlPlane, for
// benchmarks/scale.py. What it measures per rank is CPU time of the rank's thread
// (CLOCK_THREAD_CPUTIME_ID), not wall time: with hundreds of rank threads on a few cores the wall
// time is the scheduler's. Bytes are counted at the ControlPlane interface as a real transport
// would carry them for this rank: what it sends and receives in the gather (the coordinator
// receives every rank's message), the broadcast (sent once by the coordinator, received by every
// other rank) and the bitwise OR (its words out and back).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/errors.h"
#include "core/controller.h"
#include "core/message.h"
#include "core/process_set.h"
#include "testing/local_control_plane.h"

namespace py = pybind11;

namespace hvdl {
namespace {

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Forwards to a LocalControlPlane and counts this rank's bytes in and out.
class CountingControlPlane : public ControlPlane {
 public:
  CountingControlPlane(std::shared_ptr<LocalFabric> fabric, int rank) : inner_(fabric, rank) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  Status StartBitwiseOr(uint64_t* words, size_t n) override {
    bytes += static_cast<int64_t>(2 * n * sizeof(uint64_t));  // out, and the result back
    return inner_.StartBitwiseOr(words, n);
  }
  Status TestBitwiseOr(bool* done) override {
    const double t0 = ThreadCpuSeconds();
    Status s = inner_.TestBitwiseOr(done);
    transport_cpu += ThreadCpuSeconds() - t0;
    return s;
  }
  Status Gather(const std::string& send, std::vector<std::string>* recv) override {
    const double t0 = ThreadCpuSeconds();
    Status s = inner_.Gather(send, recv);
    transport_cpu += ThreadCpuSeconds() - t0;
    if (rank() == 0) {
      for (size_t i = 1; i < recv->size(); ++i) bytes += static_cast<int64_t>((*recv)[i].size());
    } else {
      bytes += static_cast<int64_t>(send.size());
    }
    return s;
  }
  Status Broadcast(std::string* data) override {
    const double t0 = ThreadCpuSeconds();
    Status s = inner_.Broadcast(data);
    transport_cpu += ThreadCpuSeconds() - t0;
    bytes += static_cast<int64_t>(data->size());
    return s;
  }
  int64_t bytes = 0;
  double transport_cpu = 0;  // inside the in-process fabric (stands for the network)

 private:
  LocalControlPlane inner_;
};

struct RankFigures {
  double cpu_seconds = 0;        // the rank's thread, the fabric's share excluded
  double transport_seconds = 0;  // the fabric's share
  int64_t bytes = 0;
  uint64_t cycles = 0;
  ControllerStats stats;
  std::string error;
};

// One rank's thread: `steps` training steps, each submitting every tensor and cycling until all
// have responses (every rank sees the same responses, so all stop in the same cycle). `warmup`
// steps are not measured. The late rank submits its requests `late_seconds` into the first
// measured step and cycles with nothing to offer meanwhile, as a busy rank's background thread
// does; every rank sleeps 1 ms after a cycle that completed nothing (the loop's backoff).
void RunRank(int rank, int nranks, const std::shared_ptr<LocalFabric>& fabric,
             const std::vector<Request>& requests, size_t cache_capacity, int warmup, int steps,
             int late_rank, double late_seconds, double stall_seconds, RankFigures* out) {
  CountingControlPlane cp(fabric, rank);
  ProcessSetTable table(nranks);
  Controller ctl(&cp, &table, cache_capacity, stall_seconds, 0);
  double cpu_start = 0, transport_start = 0;
  int64_t bytes_start = 0;
  // Each step's requests, copied before the clock starts (a real rank moves them in from its
  // queue; the copy is the harness's).
  std::vector<std::vector<Request>> batches(static_cast<size_t>(warmup + steps), requests);
  uint64_t cycles_start = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    if (step == warmup) {
      cpu_start = ThreadCpuSeconds();
      transport_start = cp.transport_cpu;
      bytes_start = cp.bytes;
      cycles_start = ctl.stats().cycles;
    }
    const bool late = rank == late_rank && step == warmup;
    const auto submit_at =
        std::chrono::steady_clock::now() +
        std::chrono::microseconds(late ? static_cast<int64_t>(late_seconds * 1e6) : 0);
    bool submitted = false;
    size_t completed = 0;
    while (completed < requests.size()) {
      if (!submitted && std::chrono::steady_clock::now() >= submit_at) {
        ctl.Submit(batches[static_cast<size_t>(step)]);
        submitted = true;
      }
      Status s = ctl.StartCycle();
      bool done = false;
      while (s.ok() && !done) s = ctl.TestCycle(&done);
      CycleResult result;
      if (s.ok()) s = ctl.FinishCycle(&result);
      if (!s.ok()) {
        out->error = "rank " + std::to_string(rank) + ": " + s.message();
        return;
      }
      completed += result.responses.size();
      if (result.responses.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  out->transport_seconds = cp.transport_cpu - transport_start;
  out->cpu_seconds = ThreadCpuSeconds() - cpu_start - out->transport_seconds;
  out->bytes = cp.bytes - bytes_start;
  out->cycles = ctl.stats().cycles - cycles_start;
  out->stats = ctl.stats();
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// scale_control_plane(nranks, case, names, sizes, steps, late_seconds, stall_seconds): see
// benchmarks/scale.py. `case`: uncached (no response cache: every step negotiates, as the first
// step does), cached (the steady state, after one warm-up step) or late (cached, and the last
// rank submits `late_seconds` late in the measured step, the stall inspector checking every
// `stall_seconds`).
py::dict ScaleControlPlane(int nranks, const std::string& kind, const std::vector<std::string>& names,
                           const std::vector<int64_t>& sizes, int steps, double late_seconds,
                           double stall_seconds) {
  if (kind != "uncached" && kind != "cached" && kind != "late") {
    ThrowIfError(Status::InvalidArgument("case: uncached, cached or late, not " + kind));
  }
  if (nranks < 2 || names.size() != sizes.size() || names.empty() || steps < 1) {
    ThrowIfError(Status::InvalidArgument("nranks >= 2, steps >= 1 and one size per name"));
  }
  std::vector<Request> requests;
  for (size_t i = 0; i < names.size(); ++i) {
    Request q;
    q.name = names[i];
    q.shape = {sizes[i]};
    q.site = "train.py:42";
    requests.push_back(std::move(q));
  }
  const bool cached = kind != "uncached";
  const int warmup = cached ? 1 : 0;
  const int measured = kind == "late" ? 1 : steps;
  auto fabric = std::make_shared<LocalFabric>(nranks);
  std::vector<RankFigures> figures(static_cast<size_t>(nranks));
  const auto start = std::chrono::steady_clock::now();
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) {
      threads.emplace_back([&, r] {
        RunRank(r, nranks, fabric, requests, cached ? 1024 : 0, warmup, measured,
                kind == "late" ? nranks - 1 : -1, late_seconds,
                kind == "late" ? stall_seconds : 0, &figures[static_cast<size_t>(r)]);
      });
    }
    for (auto& t : threads) t.join();
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const RankFigures& f : figures) {
    if (!f.error.empty()) throw InternalError(f.error);
  }
  const RankFigures& coordinator = figures[0];
  const double cycles = static_cast<double>(std::max<uint64_t>(1, coordinator.cycles));
  std::vector<double> worker_cpu, worker_bytes, worker_transport;
  for (size_t r = 1; r < figures.size(); ++r) {
    worker_cpu.push_back(figures[r].cpu_seconds * 1e6 / cycles);
    worker_transport.push_back(figures[r].transport_seconds * 1e6 / cycles);
    worker_bytes.push_back(static_cast<double>(figures[r].bytes) / cycles);
  }
  py::dict d;
  d["ranks"] = nranks;
  d["case"] = kind;
  d["tensors"] = names.size();
  d["cycles"] = coordinator.cycles;
  d["worker_cpu_us_per_cycle"] = Median(worker_cpu);
  d["worker_cpu_us_per_cycle_max"] = *std::max_element(worker_cpu.begin(), worker_cpu.end());
  d["coordinator_cpu_us_per_cycle"] = coordinator.cpu_seconds * 1e6 / cycles;
  d["worker_fabric_cpu_us_per_cycle"] = Median(worker_transport);
  d["coordinator_fabric_cpu_us_per_cycle"] = coordinator.transport_seconds * 1e6 / cycles;
  d["bytes_per_rank_per_cycle"] = Median(worker_bytes);
  d["coordinator_bytes_per_cycle"] = static_cast<double>(coordinator.bytes) / cycles;
  d["negotiations"] = coordinator.stats.negotiations;
  d["cache_hits"] = coordinator.stats.cache_hits;
  d["wall_seconds"] = wall;
  return d;
}

}  // namespace

void RegisterScaleTesting(py::module_& m) {
  m.def("scale_control_plane", &ScaleControlPlane, py::arg("nranks"), py::arg("case"),
        py::arg("names"), py::arg("sizes"), py::arg("steps") = 10, py::arg("late_seconds") = 1.0,
        py::arg("stall_seconds") = 0.5);
}

}  // namespace hvdl
