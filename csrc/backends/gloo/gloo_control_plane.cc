#include "backends/gloo/gloo_control_plane.h"

#include <algorithm>
#include <cstring>

#include "backends/gloo/gloo_work.h"

namespace hvdl {

GlooControlPlane::GlooControlPlane(c10::intrusive_ptr<c10d::Backend> backend,
                                   GlooWaits* waits)
    : backend_(std::move(backend)),
      rank_(backend_->getRank()),
      size_(backend_->getSize()),
      waits_(waits) {}

Status GlooControlPlane::Run(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  return WaitWork(work, std::string("the negotiation's ") + what + " (every rank takes part)",
                  waits_);
}

Status GlooControlPlane::StartBitwiseOr(uint64_t* words, size_t n) {
  if (pending_) return Status::Internal("a bitwise OR is already outstanding");
  words_ = words;
  n_ = n;
  if (!words_tensor_.defined() || words_tensor_.numel() != static_cast<int64_t>(n)) {
    words_tensor_ = at::empty({static_cast<int64_t>(n)}, at::TensorOptions().dtype(at::kLong));
  }
  std::memcpy(words_tensor_.data_ptr(), words, n * sizeof(uint64_t));
  std::vector<at::Tensor> tensors{words_tensor_};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp(c10d::ReduceOp::BOR);
  return PostWork([&] { return backend_->allreduce(tensors, options); },
                  "the negotiation's bitwise OR", &pending_);
}

Status GlooControlPlane::TestBitwiseOr(bool* done) {
  *done = false;
  if (!pending_) return Status::Internal("no bitwise OR is outstanding");
  bool completed = false;
  try {
    completed = pending_->isCompleted();
  } catch (const std::exception& e) {
    completed = true;
  }
  if (!completed) return Status::Ok();
  c10::intrusive_ptr<c10d::Work> work = std::move(pending_);
  pending_.reset();
  HVDL_RETURN_IF_ERROR(Run(work, "bitwise OR"));  // completed: returns at once, or its error
  std::memcpy(words_, words_tensor_.data_ptr(), n_ * sizeof(uint64_t));
  *done = true;
  return Status::Ok();
}

Status GlooControlPlane::Gather(const std::string& send, std::vector<std::string>* recv) {
  // Step 1: every rank's length, on every rank.
  at::Tensor mine = at::full({1}, static_cast<int64_t>(send.size()), at::kLong);
  std::vector<at::Tensor> in{mine};
  std::vector<std::vector<at::Tensor>> lengths(1);
  for (int r = 0; r < size_; ++r) lengths[0].push_back(at::empty({1}, at::kLong));
  c10::intrusive_ptr<c10d::Work> work;
  HVDL_RETURN_IF_ERROR(PostWork([&] { return backend_->allgather(lengths, in); },
                                "the negotiation's gather of lengths", &work));
  HVDL_RETURN_IF_ERROR(Run(work, "gather of lengths"));
  int64_t longest = 1;
  for (const at::Tensor& t : lengths[0]) longest = std::max(longest, t.item<int64_t>());
  // Step 2: every contribution, padded to the longest, to rank 0.
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), send.data(), send.size());
  std::vector<at::Tensor> data_in{padded};
  std::vector<std::vector<at::Tensor>> data_out(1);
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) data_out[0].push_back(at::empty({longest}, at::kByte));
  } else {
    data_out.clear();
  }
  c10d::GatherOptions options;
  options.rootRank = 0;
  HVDL_RETURN_IF_ERROR(PostWork([&] { return backend_->gather(data_out, data_in, options); },
                                "the negotiation's gather", &work));
  HVDL_RETURN_IF_ERROR(Run(work, "gather"));
  recv->clear();
  if (rank_ != 0) return Status::Ok();
  for (int r = 0; r < size_; ++r) {
    const char* p = static_cast<const char*>(data_out[0][static_cast<size_t>(r)].data_ptr());
    recv->emplace_back(p, static_cast<size_t>(lengths[0][static_cast<size_t>(r)].item<int64_t>()));
  }
  return Status::Ok();
}

Status GlooControlPlane::Broadcast(std::string* data) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(rank_ == 0 ? data->size() : 0), at::kLong);
  std::vector<at::Tensor> tensors{length};
  c10d::BroadcastOptions options;
  options.rootRank = 0;
  c10::intrusive_ptr<c10d::Work> work;
  HVDL_RETURN_IF_ERROR(PostWork([&] { return backend_->broadcast(tensors, options); },
                                "the negotiation's broadcast of the length", &work));
  HVDL_RETURN_IF_ERROR(Run(work, "broadcast of the length"));
  const int64_t n = length.item<int64_t>();
  if (n == 0) {
    data->clear();
    return Status::Ok();
  }
  if (rank_ != 0) data->assign(static_cast<size_t>(n), '\0');
  std::vector<at::Tensor> bytes{at::from_blob(data->data(), {n}, at::kByte)};
  HVDL_RETURN_IF_ERROR(PostWork([&] { return backend_->broadcast(bytes, options); },
                                "the negotiation's broadcast", &work));
  return Run(work, "broadcast");
}

}  // namespace hvdl
