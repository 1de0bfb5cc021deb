#include "backends/gloo/gloo_world.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "backends/gloo/gloo_fabric.h"
#include "backends/gloo/gloo_watchdog.h"
#include "comm/hierarchical_control_plane.h"

namespace hvdl {
namespace {

// What the runtime's pieces share and the Context outlives: the group, the waits' settings and
// cancellation, the watchdog.
struct GlooWorld {
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::Backend> backend;
  GlooWaits waits;
  std::unique_ptr<GlooWatchdog> watchdog;
};

// The control plane: the local one among this host's ranks, Gloo among the hosts' roots (the
// lowest rank of each host, hosts in the order of their first rank: global rank 0 is the first
// root).
Status ControlPlaneFor(const GlooLaunch& launch, const Config& config, const LocalParts& local,
                       GlooFabric* fabric, std::unique_ptr<ControlPlane>* out) {
  HierarchicalLayout layout;
  layout.size = launch.size;
  std::map<std::string, int> root_of;
  const std::string& here = launch.hosts[static_cast<size_t>(launch.rank)];
  for (int r = 0; r < launch.size; ++r) {
    const std::string& h = launch.hosts[static_cast<size_t>(r)];
    if (root_of.emplace(h, r).second) layout.root_ranks.push_back(r);
    if (h == here) layout.local_ranks.push_back(r);
  }
  // The controller's words per round: flags, then a bit per cache slot twice (invalid, not ready).
  const size_t words = 1 + 2 * ((static_cast<size_t>(config.cache_capacity) + 63) / 64);
  std::unique_ptr<ControlPlane> on_host;
  HVDL_RETURN_IF_ERROR(local.control(layout.local_ranks, words, &on_host));
  std::unique_ptr<Transport> cross;
  const bool root = layout.local_ranks.front() == launch.rank;
  if (root && layout.root_ranks.size() > 1) cross = fabric->Gloo(layout.root_ranks, 0);
  std::unique_ptr<HierarchicalControlPlane> control;
  HVDL_RETURN_IF_ERROR(
      HierarchicalControlPlane::Create(std::move(on_host), std::move(cross), layout, &control));
  *out = std::move(control);
  return Status::Ok();
}

// GlooWaits::close: closes every connection of the group, so that a cancel is final. c10d offers
// no abort for Gloo, but Gloo itself closes every pair of a context when a wait of it times out
// ("Application timeout caused pair closure": each pending operation fails, no buffer is
// touched again). So, per context (c10d sends tag t on context t mod contexts), a receive on a
// tag no transport uses, waited for 1 ms. A post fails on a pair that is already closed (a lost
// peer): then the next peer's. Runs once, on the thread that cancels.
void CloseConnections(c10d::Backend* backend, int connections) {
  const int base = ((1 << 30) / connections) * connections;  // above every transport's tags
  const int n = backend->getSize(), me = backend->getRank();
  for (int k = 0; k < connections; ++k) {
    for (int step = 1; step < n; ++step) {
      try {
        std::vector<at::Tensor> one{at::empty({1}, at::TensorOptions().dtype(at::kByte))};
        auto work = backend->recv(one, (me + step) % n, base + k);
        try {
          work->wait(std::chrono::milliseconds(1));
        } catch (const std::exception& e) {
          if (std::string(e.what()).find("Timed out") != std::string::npos) break;
        }
      } catch (const std::exception&) {
        // that pair was closed already: try the next
      }
    }
  }
}

}  // namespace

Status BuildGloo(const GlooLaunch& launch, const Config& config, const LocalParts& local,
                 CommRuntime* out) {
  if (static_cast<int>(launch.hosts.size()) != launch.size) {
    return Status::Internal("the Gloo launch names " + std::to_string(launch.hosts.size()) +
                            " hosts for " + std::to_string(launch.size) + " ranks");
  }
  auto world = std::make_shared<GlooWorld>();
  if (!launch.process_group.empty()) {  // several hosts: Gloo between them
    try {
      world->group = c10d::resolve_process_group(launch.process_group);
      world->backend = world->group->getBackend(c10::DeviceType::CPU);
    } catch (const std::exception& e) {
      return Status::Internal("the job's Gloo process group '" + launch.process_group +
                              "' cannot be found: " + e.what());
    }
    const c10::intrusive_ptr<c10d::Backend>& backend = world->backend;
    if (backend->getRank() != launch.rank || backend->getSize() != launch.size) {
      return Status::Internal("the Gloo process group is rank " +
                              std::to_string(backend->getRank()) + " of " +
                              std::to_string(backend->getSize()) + ", the launch says rank " +
                              std::to_string(launch.rank) + " of " + std::to_string(launch.size));
    }
  } else if (launch.cross_size > 1) {
    return Status::Internal("a job over several hosts needs the Gloo process group");
  }
  Topology& t = out->topology;
  t.rank = launch.rank;
  t.size = launch.size;
  t.local_rank = launch.local_rank;
  t.local_size = launch.local_size;
  t.cross_rank = launch.cross_rank;
  t.cross_size = launch.cross_size;
  t.thread_multiple = true;
  world->waits.timeout_seconds = launch.timeout_seconds;
  c10::intrusive_ptr<c10d::Store> beats;
  if (world->group) {
    beats = world->group->getStore();
  } else if (!launch.beats_group.empty()) {
    try {
      beats = c10d::resolve_process_group(launch.beats_group)->getStore();
    } catch (const std::exception& e) {
      return Status::Internal("the job's heartbeat group '" + launch.beats_group +
                              "' cannot be found: " + e.what());
    }
  }
  if (beats) {
    world->watchdog = std::make_unique<GlooWatchdog>(beats, launch.rank, launch.hosts,
                                                     launch.timeout_seconds, launch.beat_seconds);
    world->waits.watchdog = world->watchdog.get();
  }
  GlooWorld* w = world.get();
  auto fabric = std::make_unique<GlooFabric>(world->backend, launch, &world->waits, local);
  t.homogeneous = fabric->homogeneous();
  HVDL_RETURN_IF_ERROR(ControlPlaneFor(launch, config, local, fabric.get(), &out->control));
  out->fabric = std::move(fabric);
  out->watch = [w](std::function<void(const std::string&)> lost) {
    if (w->watchdog) w->watchdog->Watch(std::move(lost));
  };
  out->stop_watching = [w] {
    w->waits.watchdog = nullptr;
    w->watchdog.reset();
  };
  if (world->backend) {
    const int connections = std::max(1, launch.connections);
    w->waits.close = [w, connections] { CloseConnections(w->backend.get(), connections); };
  }
  out->cancel = [w](const std::string& why) { w->waits.Cancel(why); };
  out->restartable_after_loss = true;  // the next round meets without the lost ranks
  out->owner = std::move(world);
  return Status::Ok();
}

}  // namespace hvdl
