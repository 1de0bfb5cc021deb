#include "core/executor.h"

#include <chrono>

#include "common/logging.h"
#include "core/collective_layout.h"
#include "core/handle_table.h"

namespace hvdl {

Executor::Executor(const ExecutorDeps& deps)
    : d_(deps), ops_(deps.sets, deps.planner, deps.backends, deps.rank), host_(deps.fusion) {
  if (d_.device_ops != nullptr) device_ = std::make_unique<DeviceMemory>(d_.device_ops, d_.rank);
}

void Executor::set_stream_completion(bool on) {
  if (device_) device_->set_stream_completion(on);
}

void Executor::set_failure_wait(double seconds) {
  if (device_) device_->set_failure_wait(seconds);
}

void Executor::PollDevice() {
  if (!device_ || device_->in_flight() == 0) return;
  Status s = device_->Poll();
  if (s.ok()) return;
  HVDL_LOG(Error) << s.message();
  if (device_failure_.ok()) device_failure_ = s;
}

int64_t Executor::PayloadBytes(const Response& r) const {
  const int64_t esize = static_cast<int64_t>(DataTypeSize(r.dtype));
  switch (r.op) {
    case OpType::kAllreduce:
    case OpType::kBroadcast:
    case OpType::kReducescatter:
      return NumElements(r.shape) * esize;
    case OpType::kAllgather: {
      int64_t rows = 0;
      for (int64_t s : r.sizes) rows += s;
      return rows * Trailing(r.shape) * esize;
    }
    default:
      return 0;
  }
}

int Executor::Run(const std::vector<Response>& responses, bool joined) {
  Items items;
  std::vector<const Response*> mine;
  std::vector<int64_t> bytes;
  items.reserve(responses.size());  // an Item is large: regrowing moved each up to 8 times
  mine.reserve(responses.size());
  bytes.reserve(responses.size());
  for (const Response& r : responses) {
    const bool everyone = r.op == OpType::kProcessSetAdd || r.op == OpType::kProcessSetRemove ||
                    r.op == OpType::kJoin;
    if (!everyone && d_.sets->RankIn(r.process_set, d_.rank) < 0) continue;
    BatchItem it;
    it.response = &r;
    it.has_entry = d_.queue->Take(r.Key(), &it.entry);
    bool zeros = !it.has_entry && joined && r.op == OpType::kAllreduce && !r.is_error();
    if (!it.has_entry && !zeros) continue;  // e.g. an error about a collective this rank skipped
    mine.push_back(&r);
    bytes.push_back(PayloadBytes(r));
    items.push_back(std::move(it));
  }
  const std::vector<Batch> batches = PlanBatches(mine, threshold_, bytes);
  if (batches.size() == 1 && batches[0].members.size() == items.size()) {
    last_batch_bytes_ = batches[0].bytes;  // everything fused, in order: no regrouping
    RunBatch(items);
    return static_cast<int>(mine.size());
  }
  for (const Batch& batch : batches) {
    Items group;
    group.reserve(batch.members.size());
    for (size_t i : batch.members) group.push_back(std::move(items[i]));
    last_batch_bytes_ = batch.bytes;
    RunBatch(group);
  }
  return static_cast<int>(mine.size());
}

void Executor::RunBatch(Items& items) {
  const Response& r = *items.front().response;
  if (r.is_error()) return Finish(items, Status(r.error_code, r.error), {});
  std::vector<int64_t> extra;
  Status s;
  switch (r.op) {
    case OpType::kBarrier:
      break;
    case OpType::kJoin:
      extra = r.sizes;
      break;
    case OpType::kProcessSetAdd:
    case OpType::kProcessSetRemove:
      s = RunProcessSet(items.front(), &extra);
      break;
    default: {
      const auto start = std::chrono::steady_clock::now();
      DataBackend* be = nullptr;
      s = RunData(items, &be, &extra);
      if (observer_ != nullptr && s.ok()) {
        int64_t total = 0;
        for (const BatchItem& it : items) total += PayloadBytes(*it.response);
        const double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        observer_->CollectiveDone(r.op, static_cast<int>(items.size()), total,
                                  d_.sets->Size(r.process_set), secs);
      }
    }
  }
  Finish(items, s, extra);
}

// One data batch in the memory its tensors live in.
Status Executor::RunData(Items& items, DataBackend** be, std::vector<int64_t>* extra) {
  const int device = items.front().response->device;
  BatchMemory* memory = &host_;
  if (device != kCpuDevice) {
    if (!device_) {
      return Status::Internal("a collective on " + DeviceName(device) +
                              " reached a build without device support");
    }
    memory = device_.get();
  }
  HVDL_RETURN_IF_ERROR(memory->Begin(items));
  Status s = ops_.Run(items, memory, [&](const char* activity) { Phase(items, activity); }, be,
                      extra);
  if (memory == device_.get() && !device_failure_.ok()) {
    // Found by PollDevice: the first device batch after it reports it. The batch itself ran
    // (every rank runs it: skipping it here would leave the others waiting in its collective),
    // so it fails as a batch whose collective failed: End waits for its queued work before its
    // entries complete with the error (the user may free the tensors as soon as they do).
    if (s.ok()) s = device_failure_;
    device_failure_ = Status::Ok();
  }
  return memory->End(s, items, *be);
}

void Executor::Finish(Items& items, const Status& status, const std::vector<int64_t>& extra) {
  if (observer_ != nullptr && observer_->Recording()) {
    Trace(items);
    observer_->Done();
  }
  traced_ = nullptr;
  CompletionBatch batch;  // the user thread wakes once for the whole batch
  for (BatchItem& it : items) {
    if (!it.has_entry) continue;
    Status s = status;
    if (!s.ok() && !it.response->is_error()) {
      s = Status(s.code(), TensorLabel(OpTypeName(it.response->op), it.response->name) + ": " +
                               s.message());
    }
    d_.queue->Complete(&it.entry, s, extra);
  }
}

void Executor::Trace(const Items& items) {
  if (traced_ == &items) return;
  observer_->Begin();
  for (const BatchItem& it : items) {
    observer_->Member(it.response->name, it.response->process_set);
  }
  traced_ = &items;
}

void Executor::Phase(const Items& items, const char* activity) {
  if (observer_ == nullptr || !observer_->Recording()) return;
  Trace(items);
  observer_->Activity(activity);
}

Status Executor::RunProcessSet(BatchItem& item, std::vector<int64_t>* extra) {
  const Response& r = *item.response;
  if (r.op == OpType::kProcessSetAdd) {
    std::vector<int> ranks(r.sizes.begin(), r.sizes.end());
    int id = d_.sets->NextId();
    HVDL_RETURN_IF_ERROR(d_.backends->AddProcessSet(id, ranks));
    d_.sets->Add(id, ranks);
    *extra = {id};
    return Status::Ok();
  }
  int id = r.sizes.empty() ? -1 : static_cast<int>(r.sizes[0]);
  HVDL_RETURN_IF_ERROR(d_.backends->RemoveProcessSet(id));
  d_.sets->Remove(id);
  *extra = {id};
  return Status::Ok();
}

}  // namespace hvdl
