#include "backends/gloo/gloo_world.h"

#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "backends/gloo/gloo_control_plane.h"
#include "backends/gloo/gloo_fabric.h"
#include "backends/gloo/gloo_watchdog.h"

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

}  // namespace

Status BuildGloo(const GlooLaunch& launch, const Config& config, CommRuntime* out) {
  if (static_cast<int>(launch.hosts.size()) != launch.size) {
    return Status::Internal("the Gloo launch names " + std::to_string(launch.hosts.size()) +
                            " hosts for " + std::to_string(launch.size) + " ranks");
  }
  auto world = std::make_shared<GlooWorld>();
  try {
    world->group = c10d::resolve_process_group(launch.process_group);
    world->backend = world->group->getBackend(c10::DeviceType::CPU);
  } catch (const std::exception& e) {
    return Status::Internal("the job's Gloo process group '" + launch.process_group +
                            "' cannot be found: " + e.what());
  }
  const c10::intrusive_ptr<c10d::Backend>& backend = world->backend;
  if (backend->getRank() != launch.rank || backend->getSize() != launch.size) {
    return Status::Internal("the Gloo process group is rank " + std::to_string(backend->getRank()) +
                            " of " + std::to_string(backend->getSize()) +
                            ", the launch says rank " + std::to_string(launch.rank) + " of " +
                            std::to_string(launch.size));
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
  if (launch.size > 1) {
    world->watchdog = std::make_unique<GlooWatchdog>(world->group->getStore(), launch.rank,
                                                     launch.hosts, launch.timeout_seconds);
    world->waits.watchdog = world->watchdog.get();
  }
  auto fabric = std::make_unique<GlooFabric>(backend, launch, &world->waits);
  t.homogeneous = fabric->homogeneous();
  out->control = std::make_unique<GlooControlPlane>(backend, &world->waits);
  out->fabric = std::move(fabric);
  GlooWorld* w = world.get();
  out->watch = [w](std::function<void(const std::string&)> lost) {
    if (w->watchdog) w->watchdog->Watch(std::move(lost));
  };
  out->stop_watching = [w] {
    w->waits.watchdog = nullptr;
    w->watchdog.reset();
  };
  out->cancel = [w](const std::string& why) { w->waits.Cancel(why); };
  out->owner = std::move(world);
  (void)config;
  return Status::Ok();
}

}  // namespace hvdl
