// horovodlite._testing: TensorQueue's hold wake-ups (core/tensor_queue.h), for
// tests/unit/test_queue_wakes.py: which calls end a WaitForWake (the background loop's hold of new
// work) and which leave it to its deadline.
#include <pybind11/pybind11.h>

#include <chrono>
#include <string>
#include <thread>

#include "core/tensor_queue.h"

namespace py = pybind11;

namespace hvdl {
namespace {

using Clock = std::chrono::steady_clock;

// Runs one case and returns whether the wait ended before its deadline of `wait_ms`:
//   "stale"     a Wake() before the wait's count was read;
//   "wake"      a Wake() from another thread during the wait;
//   "send_now"  a SendNow() from another thread during the wait;
//   "send_now_before"  SendNow() before the wait (it stays asked until PopRequests);
//   "popped"    SendNow(), then PopRequests() took the requests: asked no more.
bool WaitEndsEarly(const std::string& kind, int wait_ms) {
  TensorQueue queue;
  if (kind == "stale") queue.Wake();
  if (kind == "send_now_before" || kind == "popped") queue.SendNow();
  if (kind == "popped") {
    std::vector<Request> out;
    queue.PopRequests(&out);
  }
  const uint64_t seen = queue.wakes();
  std::thread other([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (kind == "wake") queue.Wake();
    if (kind == "send_now") queue.SendNow();
  });
  const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  bool early;
  {
    py::gil_scoped_release nogil;
    queue.WaitForWake(seen, deadline);
    early = Clock::now() < deadline;
    other.join();
  }
  return early;
}

}  // namespace

void RegisterQueueTesting(py::module_& m) {
  m.def("queue_wait_ends_early", &WaitEndsEarly, py::arg("kind"), py::arg("wait_ms"));
}

}  // namespace hvdl
