#include "core/device_inflight.h"

#include <utility>

namespace hvdl {

Status DeviceInFlight::Failed(const Work& w, const Status& s) {
  return Status(s.code(), "the device work of " + w.what +
                              " failed after its handles had completed "
                              "(HOROVOD_GPU_COMPLETION=stream): " + s.message());
}

Status DeviceInFlight::Add(std::shared_ptr<DeviceEvent> finished, DataBackend* be,
                           std::string what) {
  Status s = Poll();
  work_.push_back({std::move(finished), be, std::move(what)});
  while (s.ok() && work_.size() > max_depth_) {
    Work oldest = std::move(work_.front());
    work_.pop_front();
    Status w = oldest.be != nullptr ? oldest.be->WaitForDevice(oldest.finished.get())
                                    : oldest.finished->Synchronize();
    if (!w.ok()) s = Failed(oldest, w);
  }
  return s;
}

Status DeviceInFlight::Poll() {
  while (!work_.empty()) {
    Work& oldest = work_.front();
    bool done = false;
    Status s = oldest.finished->Query(&done);
    if (s.ok() && done) {
      work_.pop_front();
      continue;
    }
    if (s.ok() && oldest.be != nullptr) s = oldest.be->CheckAsync();
    if (!s.ok()) {
      Status failed = Failed(oldest, s);
      work_.pop_front();
      return failed;
    }
    return Status::Ok();  // the oldest still runs; the later ones run after it
  }
  return Status::Ok();
}

Status DeviceInFlight::Drain() {
  Status first;
  while (!work_.empty()) {
    Work oldest = std::move(work_.front());
    work_.pop_front();
    Status s = oldest.be != nullptr ? oldest.be->WaitForDevice(oldest.finished.get())
                                    : oldest.finished->Synchronize();
    if (!s.ok() && first.ok()) first = Failed(oldest, s);
  }
  return first;
}

}  // namespace hvdl
