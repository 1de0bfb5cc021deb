// scripts/tsan_check.py, outside the unit tests: TorchPayload's device events (csrc/torch/
// adapter.h) on the abort path of WaitForHandle (csrc/torch/submit.cc), which the CPU build's
// tests cannot reach (only CUDA ops have events). Context::Abort -> HandleTable::FailPending
// completes the handle; the user thread waits for it and reads the payload's events while the
// background thread's batch (BatchMemory::End -> the entry's device_done) still adds one.
// Built with -fsanitize=thread against the real headers and handle_table.cc; a race is a report.
#include <memory>
#include <thread>

#include "core/handle_table.h"
#include "torch/adapter.h"

using namespace hvdl;

struct Event : DeviceEvent {
  int device() const override { return 0; }
  Status StreamWait(void*) override { return Status::Ok(); }
  Status Query(bool* done) override {
    *done = true;
    return Status::Ok();
  }
  Status Synchronize() override { return Status::Ok(); }
};

int main() {
  size_t seen = 0;
  for (int round = 0; round < 200; ++round) {
    HandleTable table;
    auto payload = std::make_shared<TorchPayload>();
    const int h = table.Allocate(1, payload, "allreduce 'x'");
    std::thread background([&table, h, payload] {  // AddTensor's device_done, then MarkDone
      payload->AddFinished(std::make_shared<Event>());
      table.MarkDone(h, Status::Ok());
    });
    table.FailPending(Status::Aborted("a rank was lost"));  // Context::Abort
    Status op;
    std::shared_ptr<void> state;
    (void)table.Wait(h, &op, &state);  // WaitForHandle
    for (const auto& e : std::static_pointer_cast<TorchPayload>(state)->Finished()) {
      seen += e != nullptr;
    }
    background.join();
  }
  return seen > 200 ? 1 : 0;
}
