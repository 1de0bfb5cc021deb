// horovodlite._testing, shared-memory part (backends/shm, comm/hierarchical_control_plane).
//
// Two ways to run members:
//  - N threads of this process, each attaching the SAME named segment on its own (a separate
//    mapping per thread: true shared-memory semantics): messages, control-plane scripts, and
//    (testing_comm.cc, transport="shm") every transport collective;
//  - one member per process (shm_member), for tests and benchmarks that start real processes:
//    ping-pong, bandwidth, ring allreduce, bitwise-OR rounds, gathers, and waits that only a
//    dead peer ends.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "backends/shm/shm_control_plane.h"
#include "backends/shm/shm_group.h"
#include "backends/shm/shm_transport.h"
#include "comm/hierarchical_control_plane.h"
#include "comm/ring.h"
#include "comm/routed_transport.h"
#include "comm/single_copy_transport.h"
#include "common/errors.h"
#include "testing/local_control_plane.h"
#include "testing/local_transport.h"

namespace py = pybind11;

namespace hvdl {

std::string NewShmTestName(const std::string& what) {
  static std::atomic<int> counter{0};
  return "/hvdl-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++) + "-" + what;
}

Status NewShmTestTransport(const std::string& segment, int rank, int size,
                           std::unique_ptr<Transport>* out) {
  ShmGroupOptions o;
  o.timeout = std::chrono::seconds(20);
  std::shared_ptr<ShmGroup> g;
  HVDL_RETURN_IF_ERROR(ShmGroup::Attach(segment, rank, size, o, &g));
  *out = std::make_unique<ShmTransport>(std::move(g));
  return Status::Ok();
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// `bytes` bytes at `at` cut into `pieces` nearly equal spans (some empty when bytes < pieces).
std::vector<Span> Pieces(char* at, size_t bytes, int pieces) {
  std::vector<Span> out;
  const size_t k = static_cast<size_t>(std::max(pieces, 1));
  size_t done = 0;
  for (size_t i = 0; i < k; ++i) {
    const size_t n = bytes / k + (i < bytes % k ? 1 : 0);
    out.push_back(Span{at + done, static_cast<int64_t>(n)});
    done += n;
  }
  return out;
}

template <typename Body>
std::vector<std::string> RunThreads(int n, Body body) {
  std::vector<std::string> errors(static_cast<size_t>(n));
  py::gil_scoped_release nogil;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Status s = body(r);
      if (!s.ok()) errors[static_cast<size_t>(r)] = s.message();
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// messages[i] = {src, dst, tag, data, room, send_pieces, recv_pieces}: member src sends `data`
// (cut into send_pieces spans) to dst, which receives it into `room` bytes (cut into
// recv_pieces, prefilled with 0xEE). Every member posts its part of every message in list
// order, then waits for them in order. Returns per message (received bytes, receive error,
// send error).
py::list Messages(int n, const std::vector<py::dict>& messages, uint32_t slots) {
  struct Msg {
    int src, dst, tag, send_pieces, recv_pieces;
    std::string data, out, recv_error, send_error;
  };
  std::vector<Msg> msgs;
  for (const py::dict& d : messages) {
    Msg m;
    m.src = d["src"].cast<int>();
    m.dst = d["dst"].cast<int>();
    m.tag = d.contains("tag") ? d["tag"].cast<int>() : 0;
    m.data = d["data"].cast<std::string>();
    m.out.assign(d.contains("room") ? d["room"].cast<size_t>() : m.data.size(), '\xEE');
    m.send_pieces = d.contains("send_pieces") ? d["send_pieces"].cast<int>() : 1;
    m.recv_pieces = d.contains("recv_pieces") ? d["recv_pieces"].cast<int>() : 1;
    msgs.push_back(std::move(m));
  }
  const std::string name = NewShmTestName("messages");
  auto errors = RunThreads(n, [&](int r) -> Status {
    ShmGroupOptions o;
    o.slots = slots;
    o.timeout = std::chrono::seconds(20);
    std::shared_ptr<ShmGroup> g;
    HVDL_RETURN_IF_ERROR(ShmGroup::Attach(name, r, n, o, &g));
    ShmTransport t(g);
    std::vector<std::pair<size_t, int>> posted;  // (message, request); sends negative-coded
    for (size_t i = 0; i < msgs.size(); ++i) {
      Msg& m = msgs[i];
      int req;
      if (m.src == r) {
        HVDL_RETURN_IF_ERROR(t.PostSend(Pieces(m.data.data(), m.data.size(), m.send_pieces), 1,
                                        m.dst, m.tag, &req));
        posted.emplace_back(i, -1 - req);
      }
      if (m.dst == r) {
        HVDL_RETURN_IF_ERROR(t.PostRecv(Pieces(m.out.data(), m.out.size(), m.recv_pieces), 1,
                                        m.src, m.tag, &req));
        posted.emplace_back(i, req);
      }
    }
    for (auto [i, req] : posted) {
      Status s = t.Wait(req < 0 ? -1 - req : req);
      (req < 0 ? msgs[i].send_error : msgs[i].recv_error) = s.message();
    }
    return Status::Ok();
  });
  for (const std::string& e : errors) {
    if (!e.empty()) throw InternalError(e);
  }
  py::list out;
  for (const Msg& m : msgs) {
    out.append(py::make_tuple(py::bytes(m.out), m.recv_error, m.send_error));
  }
  return out;
}

// One step of a control-plane script: a bitwise OR of words[rank], a gather of strings[rank],
// or a broadcast of strings[0] (from rank 0).
struct CpStep {
  std::string kind;
  std::vector<std::vector<uint64_t>> words;
  std::vector<std::string> strings;
};

Status RunBitwiseOr(ControlPlane* cp, std::vector<uint64_t>* words) {
  bool done = false;
  HVDL_RETURN_IF_ERROR(cp->StartBitwiseOr(words->data(), words->size()));
  while (!done) {
    HVDL_RETURN_IF_ERROR(cp->TestBitwiseOr(&done));
    if (!done) std::this_thread::yield();
  }
  return Status::Ok();
}

// Where the ranks of a pretend job run: hosts[h] lists host h's global ranks in local order
// (its first is the root; the host of rank 0 first), one segment per host, one LocalTransport
// fabric among the roots.
struct PretendHosts {
  std::vector<std::vector<int>> hosts;
  std::vector<int> host_of, index_of, roots;
  std::vector<std::string> segments;
  std::shared_ptr<LocalMailboxes> cross;
  int size = 0;

  explicit PretendHosts(const std::vector<std::vector<int>>& h) : hosts(h) {
    for (const auto& members : hosts) size += static_cast<int>(members.size());
    host_of.resize(static_cast<size_t>(size));
    index_of.resize(static_cast<size_t>(size));
    for (size_t i = 0; i < hosts.size(); ++i) {
      roots.push_back(hosts[i][0]);
      segments.push_back(NewShmTestName("cp-h" + std::to_string(i)));
      for (size_t j = 0; j < hosts[i].size(); ++j) {
        host_of[static_cast<size_t>(hosts[i][j])] = static_cast<int>(i);
        index_of[static_cast<size_t>(hosts[i][j])] = static_cast<int>(j);
      }
    }
    cross = std::make_shared<LocalMailboxes>(static_cast<int>(hosts.size()));
  }
};

// Rank r's control plane: a ShmControlPlane over its host, and when `hierarchical` a
// HierarchicalControlPlane over that and (on roots) a LocalTransport among the roots.
Status MakeControlPlane(const PretendHosts& p, int r, bool hierarchical, size_t max_words,
                        std::unique_ptr<ControlPlane>* out) {
  const size_t h = static_cast<size_t>(p.host_of[static_cast<size_t>(r)]);
  const int i = p.index_of[static_cast<size_t>(r)];
  ShmGroupOptions o = ShmControlPlane::GroupOptions(max_words);
  o.timeout = std::chrono::seconds(20);
  for (int g : p.hosts[h]) o.names.push_back("rank " + std::to_string(g));
  std::shared_ptr<ShmGroup> group;
  HVDL_RETURN_IF_ERROR(
      ShmGroup::Attach(p.segments[h], i, static_cast<int>(p.hosts[h].size()), o, &group));
  *out = std::make_unique<ShmControlPlane>(group);
  if (!hierarchical) return Status::Ok();
  std::unique_ptr<Transport> cross;
  if (i == 0 && p.hosts.size() > 1) {
    cross = std::make_unique<LocalTransport>(p.cross, static_cast<int>(h));
  }
  HierarchicalLayout layout{p.size, p.hosts[h], p.roots, 0};
  std::unique_ptr<HierarchicalControlPlane> hcp;
  HVDL_RETURN_IF_ERROR(
      HierarchicalControlPlane::Create(std::move(*out), std::move(cross), layout, &hcp));
  if (hcp->rank() != r) return Status::Internal("hierarchical rank mismatch");
  *out = std::move(hcp);
  return Status::Ok();
}

using StepResult = std::pair<std::vector<uint64_t>, std::vector<std::string>>;

// Rank r runs every step on `cp`; before step k it sleeps jitter_us x ((r + 3k) mod 4)
// microseconds, so members drift ahead of each other.
Status RunSteps(ControlPlane* cp, int r, const std::vector<CpStep>& steps, int jitter_us,
                std::vector<StepResult>* results) {
  for (size_t k = 0; k < steps.size(); ++k) {
    const CpStep& step = steps[k];
    StepResult& mine = (*results)[k];
    const int delay = jitter_us * ((r + 3 * static_cast<int>(k)) % 4);
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    if (step.kind == "or") {
      mine.first = step.words[static_cast<size_t>(r)];
      HVDL_RETURN_IF_ERROR(RunBitwiseOr(cp, &mine.first));
    } else if (step.kind == "gather") {
      HVDL_RETURN_IF_ERROR(cp->Gather(step.strings[static_cast<size_t>(r)], &mine.second));
    } else {
      std::string data = r == 0 ? step.strings[0] : "stale-" + std::to_string(r);
      HVDL_RETURN_IF_ERROR(cp->Broadcast(&data));
      mine.second = {data};
    }
  }
  return Status::Ok();
}

// Every rank of the pretend job `hosts` runs `script` (("or", words per rank) | ("gather",
// strings per rank) | ("bcast", strings, rank 0's sent)). Returns per rank per step: the words
// (or), the gathered strings (gather; empty off rank 0), the string received (bcast).
py::list ControlPlaneScript(const std::vector<std::vector<int>>& hosts, const py::list& script,
                            bool hierarchical, size_t max_words, int jitter_us) {
  std::vector<CpStep> steps;
  for (const auto& item : script) {
    py::tuple t = item.cast<py::tuple>();
    CpStep s;
    s.kind = t[0].cast<std::string>();
    if (s.kind == "or") {
      s.words = t[1].cast<std::vector<std::vector<uint64_t>>>();
    } else {
      s.strings = t[1].cast<std::vector<std::string>>();
    }
    steps.push_back(std::move(s));
  }
  const PretendHosts pretend(hosts);
  std::vector<std::vector<StepResult>> results(static_cast<size_t>(pretend.size),
                                               std::vector<StepResult>(steps.size()));
  auto errors = RunThreads(pretend.size, [&](int r) -> Status {
    std::unique_ptr<ControlPlane> cp;
    HVDL_RETURN_IF_ERROR(MakeControlPlane(pretend, r, hierarchical, max_words, &cp));
    return RunSteps(cp.get(), r, steps, jitter_us, &results[static_cast<size_t>(r)]);
  });
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) throw InternalError("rank " + std::to_string(r) + ": " + errors[r]);
  }
  py::list out;
  for (const auto& per_rank : results) {
    py::list steps_out;
    for (size_t k = 0; k < steps.size(); ++k) {
      if (steps[k].kind == "or") {
        steps_out.append(py::cast(per_rank[k].first));
      } else {
        py::list strings;
        for (const std::string& s : per_rank[k].second) strings.append(py::bytes(s));
        steps_out.append(steps[k].kind == "gather" ? py::object(strings) : strings[0]);
      }
    }
    out.append(steps_out);
  }
  return out;
}

// A flat ring allreduce over RoutedTransports joining shared memory among the ranks of each
// pretend host (hosts[h]: host h's global ranks) and a LocalTransport among all of them, which
// stands in for Gloo: its receives are never known ready and its waits block. Rank r adds
// r + 1 to `count` floats; per rank: its error ("" if none) and whether every element is
// n(n+1)/2. Messages far larger than the rings (`segment`) stream through them only while their
// sender polls: the ring deadlocks unless the routed transport keeps shared memory moving while
// it waits on the other part.
py::list RoutedRing(const std::vector<std::vector<int>>& hosts, int64_t count, size_t segment,
                    uint32_t slots) {
  PretendHosts p(hosts);
  auto boxes = std::make_shared<LocalMailboxes>(p.size);
  std::vector<uint8_t> right(static_cast<size_t>(p.size), 0);
  auto errors = RunThreads(p.size, [&](int r) -> Status {
    const auto& mine = p.hosts[static_cast<size_t>(p.host_of[static_cast<size_t>(r)])];
    ShmGroupOptions o;
    o.timeout = std::chrono::seconds(20);
    if (slots > 0) o.slots = slots;
    std::shared_ptr<ShmGroup> g;
    HVDL_RETURN_IF_ERROR(ShmGroup::Attach(p.segments[static_cast<size_t>(p.host_of[r])],
                                          p.index_of[static_cast<size_t>(r)],
                                          static_cast<int>(mine.size()), o, &g));
    std::vector<std::unique_ptr<Transport>> parts;
    parts.push_back(std::make_unique<ShmTransport>(std::move(g)));
    parts.push_back(std::make_unique<LocalTransport>(boxes, r));
    std::vector<RoutedTransport::Route> routes;
    for (int m = 0; m < p.size; ++m) {
      const bool here = p.host_of[static_cast<size_t>(m)] == p.host_of[static_cast<size_t>(r)];
      routes.push_back(here ? RoutedTransport::Route{0, p.index_of[static_cast<size_t>(m)]}
                            : RoutedTransport::Route{1, m});
    }
    RoutedTransport t(std::move(parts), std::move(routes), r);
    std::vector<float> data(static_cast<size_t>(count), static_cast<float>(r + 1));
    HVDL_RETURN_IF_ERROR(RingAllreduce(
        &t, ContiguousChunks(data.data(), EvenChunks(count, p.size), DataType::kFloat32),
        DataType::kFloat32, ReduceOp::kSum, 1.0, segment, nullptr));
    const float want = static_cast<float>(p.size * (p.size + 1) / 2);
    right[static_cast<size_t>(r)] =
        std::all_of(data.begin(), data.end(), [&](float v) { return v == want; });
    return Status::Ok();
  });
  py::list out;
  for (int r = 0; r < p.size; ++r) {
    out.append(py::make_tuple(errors[static_cast<size_t>(r)], right[static_cast<size_t>(r)] != 0));
  }
  return out;
}

// Member 0 of 2 waits for a message member 1 never sends; another thread cancels the group
// after wait_ms. Returns (the wait's error | a later call's error, seconds waited).
py::tuple CancelWhileWaiting(int wait_ms) {
  const std::string name = NewShmTestName("cancel");
  std::string error;
  double seconds = 0;
  RunThreads(2, [&](int r) -> Status {
    std::shared_ptr<ShmGroup> g;
    HVDL_RETURN_IF_ERROR(ShmGroup::Attach(name, r, 2, ShmGroupOptions(), &g));
    if (r == 1) return Status::Ok();
    ShmTransport t(g);
    char byte;
    int req;
    HVDL_RETURN_IF_ERROR(t.Irecv(&byte, 1, 1, &req));
    std::thread canceller([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms));
      g->Cancel("shutting down (test)");
    });
    const auto start = Clock::now();
    error = t.Wait(req).message();
    seconds = Seconds(start);
    canceller.join();
    int again;
    error += " | later: " + t.Irecv(&byte, 1, 1, &again).message();
    return Status::Ok();
  });
  return py::make_tuple(error, seconds);
}

// HierarchicalControlPlane::Create's verdict on a layout for a member that is local member
// `local_rank` of `local_size` and, when cross_size > 0, cross member `cross_rank` of
// `cross_size`. Returns "" when accepted, else the error; and the member's global rank.
py::tuple CheckHierarchicalLayout(int local_size, int local_rank, int cross_size,
                                  int cross_rank, const HierarchicalLayout& layout) {
  auto fabric = std::make_shared<LocalFabric>(local_size);
  std::unique_ptr<Transport> cross;
  if (cross_size > 0) {
    cross = std::make_unique<LocalTransport>(std::make_shared<LocalMailboxes>(cross_size),
                                             cross_rank);
  }
  std::unique_ptr<HierarchicalControlPlane> cp;
  Status s = HierarchicalControlPlane::Create(
      std::make_unique<LocalControlPlane>(fabric, local_rank), std::move(cross), layout, &cp);
  return py::make_tuple(s.message(), s.ok() ? cp->rank() : -1);
}

py::tuple Footprint(int size, int tags, bool star, uint32_t slots, size_t words) {
  ShmGroupOptions o;
  o.tags = tags;
  o.star = star;
  o.slots = slots;
  o.bitwise_or_words = words;
  uint32_t k = 0;
  const size_t bytes = ShmGroup::Footprint(size, o, &k);
  return py::make_tuple(bytes, k);
}

}  // namespace

py::dict ShmMember(const py::dict& job);  // testing/testing_shm_member.cc

void RegisterShmTesting(py::module_& m) {
  m.def("shm_messages", &Messages, py::arg("n"), py::arg("messages"), py::arg("slots") = 0);
  m.def("shm_control_plane", &ControlPlaneScript, py::arg("hosts"), py::arg("script"),
        py::arg("hierarchical") = false, py::arg("max_words") = 64, py::arg("jitter_us") = 0);
  m.def("shm_member", &ShmMember, py::arg("job"));
  m.def("shm_footprint", &Footprint, py::arg("size"), py::arg("tags") = 4,
        py::arg("star") = false, py::arg("slots") = 0, py::arg("words") = 0);
  m.def("shm_cancel_while_waiting", &CancelWhileWaiting, py::arg("wait_ms"));
  m.def("routed_ring_allreduce", &RoutedRing, py::arg("hosts"), py::arg("count"),
        py::arg("segment"), py::arg("slots") = 0);
  m.def("check_hierarchical_layout",
        [](int local_size, int local_rank, int cross_size, int cross_rank, int size,
           const std::vector<int>& local_ranks, const std::vector<int>& root_ranks) {
          return CheckHierarchicalLayout(local_size, local_rank, cross_size, cross_rank,
                                         HierarchicalLayout{size, local_ranks, root_ranks, 0});
        });
}

}  // namespace hvdl
