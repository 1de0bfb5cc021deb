// horovodlite._testing, failure part: every algorithm over a Transport run by rank threads over
// FaultyTransports (testing/faulty_transport.h) with one failure injected - a post, a wait or a
// lost rank, at any call of any rank - reporting per rank its status and the requests it left
// outstanding, which the rule of comm/transport.h says must be none, on success or on error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <thread>

#include "comm/hierarchical.h"
#include "comm/hierarchical_control_plane.h"
#include "comm/ring.h"
#include "comm/routed_transport.h"
#include "comm/single_copy_transport.h"
#include "comm/transport_collectives.h"
#include "testing/faulty_transport.h"
#include "testing/local_control_plane.h"

namespace py = pybind11;

namespace hvdl {
namespace {

constexpr int64_t kCount = 301;  // float32 elements per rank: odd, several messages per chunk
constexpr size_t kSegment = 64;  // bytes: many messages, so failures land at many points

struct Grid {
  int hosts, per_host;
  int n() const { return hosts * per_host; }
};

// One rank's transports: flat over every rank, local among its host's, cross among the ranks of
// its local index, and the ones each algorithm builds on them; all counted.
struct RankTransports {
  std::unique_ptr<FaultyTransport> flat, local, cross, near, far;
  size_t outstanding() const {
    size_t n = 0;
    for (const auto* t : {&flat, &local, &cross, &near, &far}) n += *t ? (*t)->outstanding() : 0;
    return n;
  }
  int misuse() const {
    int n = 0;
    for (const auto* t : {&flat, &local, &cross, &near, &far}) n += *t ? (*t)->misuse() : 0;
    return n;
  }
};

// A layer (single copy, routed, the control plane) owns its transports: it gets this view of a
// counted one, which the test keeps and reads after the layer is gone.
class Borrowed : public Transport {
 public:
  explicit Borrowed(Transport* t) : t_(t) {}
  int rank() const override { return t_->rank(); }
  int size() const override { return t_->size(); }
  Status PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override {
    return t_->PostSend(spans, esize, peer, tag, request);
  }
  Status PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                  int* request) override {
    return t_->PostRecv(spans, esize, peer, tag, request);
  }
  Status Wait(int request) override { return t_->Wait(request); }
  bool Ready(int request) override { return t_->Ready(request); }

 private:
  Transport* t_;
};

std::vector<int> Range(int begin, int count, int step) {
  std::vector<int> out;
  for (int i = 0; i < count; ++i) out.push_back(begin + i * step);
  return out;
}

Status ControlPlaneOp(const std::string& op, const Grid& g, int r, Transport* cross,
                      const std::shared_ptr<LocalFabric>& host) {
  HierarchicalLayout layout;
  layout.size = g.n();
  const int h = r / g.per_host;
  layout.local_ranks = Range(h * g.per_host, g.per_host, 1);
  layout.root_ranks = Range(0, g.hosts, g.per_host);
  std::unique_ptr<Transport> x;
  if (r % g.per_host == 0 && g.hosts > 1) x = std::make_unique<Borrowed>(cross);
  std::unique_ptr<HierarchicalControlPlane> cp;
  HVDL_RETURN_IF_ERROR(HierarchicalControlPlane::Create(
      std::make_unique<LocalControlPlane>(host, r % g.per_host), std::move(x), layout, &cp));
  if (op == "control_gather") {
    std::vector<std::string> all;
    return cp->Gather(std::string(static_cast<size_t>(5 + r), 'a'), &all);
  }
  if (op == "control_broadcast") {
    std::string data = r == 0 ? std::string(77, 'b') : std::string();
    return cp->Broadcast(&data);
  }
  std::vector<uint64_t> words(3, uint64_t{1} << r);
  HVDL_RETURN_IF_ERROR(cp->StartBitwiseOr(words.data(), words.size()));
  for (bool done = false; !done;) HVDL_RETURN_IF_ERROR(cp->TestBitwiseOr(&done));
  return Status::Ok();
}

Status RunOne(const std::string& op, const Grid& g, int r, RankTransports* t,
              const std::shared_ptr<LocalFabric>& host) {
  const int n = g.n();
  std::vector<float> data(static_cast<size_t>(kCount * n), 1.0f + static_cast<float>(r));
  std::vector<float> out(data.size(), 0.0f);
  const std::vector<int64_t> counts(static_cast<size_t>(n), kCount);
  const DataType f32 = DataType::kFloat32;
  if (op == "ring_allreduce") {
    return RingAllreduce(t->flat.get(), ContiguousChunks(data.data(), EvenChunks(kCount, n), f32),
                         f32, ReduceOp::kSum, 1.0, kSegment, nullptr);
  }
  if (op == "allgather") {
    return TransportAllgatherv(t->flat.get(), data.data(), out.data(), counts, f32, kSegment);
  }
  if (op == "reducescatter") {
    return TransportReduceScatter(t->flat.get(), data.data(), out.data(), counts, f32,
                                  ReduceOp::kSum, kSegment);
  }
  if (op == "broadcast") return TransportBroadcast(t->flat.get(), data.data(), kCount, f32, 1 % n);
  if (op == "alltoall") {
    return TransportAlltoallv(t->flat.get(), data.data(), counts, out.data(), counts, f32);
  }
  if (op == "single_copy_allreduce") {
    // The single-copy layer over the counted transport, every rank on one pretend host.
    SingleCopyTransport sc(std::make_unique<Borrowed>(t->flat.get()),
                           std::vector<std::string>(static_cast<size_t>(n), "h"));
    return RingAllreduce(&sc, ContiguousChunks(data.data(), EvenChunks(kCount, n), f32), f32,
                         ReduceOp::kSum, 1.0, kSegment, nullptr);
  }
  if (op == "routed_allreduce") {
    // Members of this host through `near`, the others through `far` (over every rank).
    std::vector<RoutedTransport::Route> routes(static_cast<size_t>(n));
    for (int m = 0; m < n; ++m) {
      const bool here = m / g.per_host == r / g.per_host;
      routes[static_cast<size_t>(m)] = {here ? 0 : 1, here ? m % g.per_host : m};
    }
    std::vector<std::unique_ptr<Transport>> parts;
    parts.push_back(std::make_unique<Borrowed>(t->near.get()));
    parts.push_back(std::make_unique<Borrowed>(t->far.get()));
    RoutedTransport routed(std::move(parts), routes, r);
    return RingAllreduce(&routed, ContiguousChunks(data.data(), EvenChunks(kCount, n), f32), f32,
                         ReduceOp::kSum, 1.0, kSegment, nullptr);
  }
  std::vector<std::vector<int>> columns(static_cast<size_t>(g.per_host));
  for (int c = 0; c < g.per_host; ++c) columns[static_cast<size_t>(c)] = Range(c, g.hosts, g.per_host);
  if (op == "hierarchical_allreduce") {
    return HierarchicalAllreduce(t->local.get(), t->cross.get(),
                                 ContiguousChunks(data.data(), EvenChunks(kCount, n), f32), f32,
                                 ReduceOp::kSum, 1.0, kSegment, kSegment, nullptr);
  }
  if (op == "hierarchical_allgather") {
    return HierarchicalAllgatherv(t->local.get(), t->cross.get(), data.data(), out.data(), counts,
                                  f32, columns, kSegment, kSegment);
  }
  if (op == "hierarchical_reducescatter") {
    return HierarchicalReduceScatter(t->local.get(), t->cross.get(), data.data(), out.data(),
                                     counts, f32, ReduceOp::kSum, columns, kSegment, kSegment);
  }
  if (op.rfind("control_", 0) == 0) return ControlPlaneOp(op, g, r, t->cross.get(), host);
  return Status::InvalidArgument("unknown algorithm " + op);
}

// Per rank: (status message, "" when ok; requests left outstanding; misused waits), and the
// failing rank's calls of the plan's kind (to enumerate every failure point).
py::tuple FaultyRun(const std::string& op, int hosts, int per_host, const std::string& kind,
                    int rank, int at) {
  const Grid g{hosts, per_host};
  const int n = g.n();
  auto plan = std::make_shared<FaultPlan>();
  plan->kind = kind == "post"   ? FaultPlan::Kind::kPost
               : kind == "wait" ? FaultPlan::Kind::kWait
               : kind == "peer" ? FaultPlan::Kind::kPeer
                                : FaultPlan::Kind::kNone;
  plan->rank = rank;
  plan->at = at;
  auto boxes = [&](int size) {
    plan->boxes.push_back(std::make_shared<LocalMailboxes>(size));
    return plan->boxes.back();
  };
  auto flat = boxes(n), far = boxes(n);
  std::vector<std::shared_ptr<LocalMailboxes>> local, cross, near;
  std::vector<std::shared_ptr<LocalFabric>> host;
  for (int h = 0; h < hosts; ++h) {
    local.push_back(boxes(per_host));
    near.push_back(boxes(per_host));
    host.push_back(std::make_shared<LocalFabric>(per_host));
  }
  for (int l = 0; l < per_host; ++l) cross.push_back(boxes(hosts));
  std::vector<RankTransports> ts(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int h = r / per_host, l = r % per_host;
    RankTransports& t = ts[static_cast<size_t>(r)];
    t.flat = std::make_unique<FaultyTransport>(flat, r, Range(0, n, 1), plan);
    t.far = std::make_unique<FaultyTransport>(far, r, Range(0, n, 1), plan);
    t.local = std::make_unique<FaultyTransport>(local[size_t(h)], l, Range(h * per_host, per_host, 1),
                                                plan);
    t.near = std::make_unique<FaultyTransport>(near[size_t(h)], l, Range(h * per_host, per_host, 1),
                                               plan);
    t.cross = std::make_unique<FaultyTransport>(cross[size_t(l)], h, Range(l, hosts, per_host), plan);
  }
  std::vector<std::string> status(static_cast<size_t>(n));
  std::vector<size_t> left(static_cast<size_t>(n));
  std::vector<int> misuse(static_cast<size_t>(n));
  {
    py::gil_scoped_release nogil;
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        const size_t i = static_cast<size_t>(r);
        RankTransports& t = ts[i];
        Status s = RunOne(op, g, r, &t, host[static_cast<size_t>(r / per_host)]);
        status[i] = s.ok() ? "" : s.message();
        left[i] = t.outstanding();
        misuse[i] = t.misuse();
      });
    }
    for (auto& th : threads) th.join();
  }
  py::list ranks;
  for (int r = 0; r < n; ++r) {
    const size_t i = static_cast<size_t>(r);
    ranks.append(py::make_tuple(status[i], left[i], misuse[i]));
  }
  return py::make_tuple(ranks, plan->calls());
}

}  // namespace

void RegisterFaultTesting(py::module_& m) {
  m.def("faulty_run", &FaultyRun, py::arg("op"), py::arg("hosts"), py::arg("per_host"),
        py::arg("kind") = "", py::arg("rank") = -1, py::arg("at") = 0);
}

}  // namespace hvdl
