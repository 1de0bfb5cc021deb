// horovodlite._testing, launcher notices: LauncherNotices (core/launcher_notices) driven by a
// script, the way a process holding several Contexts (aborted ones are never destroyed) sees the
// launcher's pipe. The pipe is the one HVDL_NOTICE_FD names (claimed once per process: run it in
// a process of its own); the script writes its other end.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "core/launcher_notices.h"

namespace py = pybind11;

namespace hvdl {
namespace {

struct Received {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<std::string>> lines;  // per subscriber, in order
};

// Steps: ("subscribe",) adds subscriber i (numbered from 0); ("unsubscribe", i) destroys it;
// ("write", text) writes text to `write_fd`; ("wait", i, n) waits until subscriber i got n lines
// or `wait_seconds` passed (a bound against a hang, not a timing check: the result says how many
// came); ("round", r) is SetRound(r). Returns each subscriber's lines.
std::vector<std::vector<std::string>> NoticesScript(int write_fd,
                                                    const std::vector<py::tuple>& script,
                                                    double wait_seconds) {
  auto got = std::make_shared<Received>();
  std::vector<std::unique_ptr<LauncherNotices>> subscribers;
  py::gil_scoped_release nogil;
  for (const py::tuple& step : script) {
    std::string what;
    {
      py::gil_scoped_acquire gil;
      what = step[0].cast<std::string>();
    }
    if (what == "subscribe") {
      size_t i = 0;
      {
        std::lock_guard<std::mutex> lock(got->mu);
        i = got->lines.size();
        got->lines.emplace_back();
      }
      subscribers.push_back(std::make_unique<LauncherNotices>([got, i](const std::string& l) {
        std::lock_guard<std::mutex> lock(got->mu);
        got->lines[i].push_back(l);
        got->cv.notify_all();
      }));
    } else if (what == "unsubscribe") {
      size_t i = 0;
      {
        py::gil_scoped_acquire gil;
        i = step[1].cast<size_t>();
      }
      subscribers.at(i).reset();
    } else if (what == "write") {
      std::string text;
      {
        py::gil_scoped_acquire gil;
        text = step[1].cast<std::string>();
      }
      if (::write(write_fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
        ThrowIfError(Status::Internal("writing the notice pipe failed"));
      }
    } else if (what == "wait") {
      size_t i = 0, n = 0;
      {
        py::gil_scoped_acquire gil;
        i = step[1].cast<size_t>();
        n = step[2].cast<size_t>();
      }
      std::unique_lock<std::mutex> lock(got->mu);
      got->cv.wait_for(lock, std::chrono::duration<double>(wait_seconds),
                       [&] { return got->lines.at(i).size() >= n; });
    } else if (what == "round") {
      py::gil_scoped_acquire gil;
      LauncherNotices::SetRound(step[1].cast<int>());
    } else {
      ThrowIfError(Status::InvalidArgument("unknown step " + what));
    }
  }
  subscribers.clear();  // every subscriber ends here (this hung with a reader per subscriber)
  std::lock_guard<std::mutex> lock(got->mu);
  return got->lines;
}

}  // namespace

void RegisterNoticeTesting(py::module_& m) {
  m.def("launcher_notices_script", &NoticesScript, py::arg("write_fd"), py::arg("script"),
        py::arg("wait_seconds") = 10.0);
}

}  // namespace hvdl
