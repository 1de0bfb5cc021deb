// horovodlite._testing: HandleTable's waits (core/handle_table.h) against a completing thread,
// for tests/unit/test_handle_waits.py.
//
// A completer thread marks handle after handle done, each after a delay drawn around the spin
// window (so completions land before, inside and after it, and at its very end); this thread
// waits on each. A lost wake-up would hang a wait: a watchdog fails whatever is still pending
// after `timeout_s` (FailPending), and such waits are counted as rescued instead of hanging the
// test.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "core/handle_table.h"

namespace py = pybind11;

namespace hvdl {
namespace {

py::dict WaitAgainstCompleter(int rounds, int spin_us, int max_delay_us, double timeout_s) {
  HandleTable table;
  table.SetSpinWindow(std::chrono::microseconds(spin_us));
  std::vector<int> handles;
  for (int i = 0; i < rounds; ++i) handles.push_back(table.Allocate(1, nullptr));
  std::atomic<int> next{0};  // the handle the waiter is at
  std::thread completer([&] {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> delay(0, max_delay_us);
    for (int i = 0; i < rounds; ++i) {
      while (next.load() < i) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::microseconds(delay(rng)));
      table.MarkDone(handles[static_cast<size_t>(i)], Status::Ok());
    }
  });
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return finished; })) {
      table.FailPending(Status::Internal("watchdog"));
    }
  });
  int completed = 0, rescued = 0;
  {
    py::gil_scoped_release nogil;
    for (int i = 0; i < rounds; ++i) {
      next.store(i);
      Status op_status;
      std::shared_ptr<void> payload;
      (void)table.Wait(handles[static_cast<size_t>(i)], &op_status, &payload);
      ++(op_status.ok() ? completed : rescued);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
    }
    cv.notify_all();
    completer.join();
    watchdog.join();
  }
  py::dict out;
  out["completed"] = completed;
  out["rescued"] = rescued;
  out["left"] = static_cast<int>(table.size());
  return out;
}

// Handle ids across the wrap: the table's next id set to `start`, then `count` allocations with
// `held` (ids still in use) allocated first; returns the ids handed out.
std::vector<int> IdsFrom(int start, int count, const std::vector<int>& held) {
  HandleTable table;
  for (int h : held) {
    table.SetNextIdForTesting(h);
    table.Allocate(1, nullptr);
  }
  table.SetNextIdForTesting(start);
  std::vector<int> ids;
  for (int i = 0; i < count; ++i) ids.push_back(table.Allocate(1, nullptr));
  return ids;
}

}  // namespace

void RegisterHandleTesting(py::module_& m) {
  m.def("wait_against_completer", &WaitAgainstCompleter, py::arg("rounds"), py::arg("spin_us"),
        py::arg("max_delay_us"), py::arg("timeout_s") = 20.0);
  m.def("handle_ids_from", &IdsFrom, py::arg("start"), py::arg("count"),
        py::arg("held") = std::vector<int>());
}

}  // namespace hvdl
