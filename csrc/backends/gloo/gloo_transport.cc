#include "backends/gloo/gloo_transport.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

#include "backends/gloo/gloo_work.h"

namespace hvdl {

GlooTransport::GlooTransport(c10::intrusive_ptr<c10d::Backend> backend, std::vector<int> members,
                             int rank, int tag_base, std::vector<std::string> names,
                             GlooWaits* waits, int connections)
    : backend_(std::move(backend)),
      members_(std::move(members)),
      rank_(rank),
      tag_base_(tag_base),
      names_(std::move(names)),
      waits_(waits),
      connections_(std::max(1, connections)) {}

GlooTransport::Request& GlooTransport::NewRequest(int* id) {
  if (!free_.empty()) {
    *id = free_.back();
    free_.pop_back();
  } else {
    requests_.emplace_back();
    *id = static_cast<int>(requests_.size() - 1);
  }
  return requests_[static_cast<size_t>(*id)];
}

Status GlooTransport::Post(bool send, const std::vector<Span>& spans, size_t esize, int peer,
                           int tag, int* request) {
  if (tag < 0 || tag >= kTags) return Status::Internal("Gloo transport: tag out of range");
  if (waits_->cancelled) return waits_->Cancelled();  // the group's connections are closed
  Request& r = NewRequest(request);
  r.unpack.clear();
  int64_t bytes = 0;
  for (const Span& s : spans) bytes += s.count * static_cast<int64_t>(esize);
  void* data = nullptr;
  if (spans.size() == 1) {
    data = spans[0].data;
  } else {  // one c10d message is one tensor: pack (send) or land and unpack later (receive)
    r.staging.resize(static_cast<size_t>(bytes));
    data = r.staging.data();
    char* p = r.staging.data();
    for (const Span& s : spans) {
      const size_t n = static_cast<size_t>(s.count) * esize;
      if (send) {
        std::memcpy(p, s.data, n);
      } else {
        r.unpack.push_back(Span{s.data, static_cast<int64_t>(n)});
      }
      p += n;
    }
  }
  const int global = members_[static_cast<size_t>(peer)];
  r.what = std::string(send ? "send to " : "receive from ") + names_[static_cast<size_t>(peer)];
  const int stripes =
      static_cast<int>(std::clamp<int64_t>(bytes / kStripeBytes, 1, connections_));
  r.works.assign(static_cast<size_t>(stripes), {});
  Status s;
  for (int k = 0; k < stripes && s.ok(); ++k) {
    const int64_t begin = bytes * k / stripes, end = bytes * (k + 1) / stripes;
    const int gloo_tag = (tag_base_ + tag) * connections_ + k;
    std::vector<at::Tensor> tensors{at::from_blob(static_cast<char*>(data) + begin,
                                                  {end - begin},
                                                  at::TensorOptions().dtype(at::kByte))};
    s = PostWork(
        [&] {
          return send ? backend_->send(tensors, global, gloo_tag)
                      : backend_->recv(tensors, global, gloo_tag);
        },
        r.what, &r.works[static_cast<size_t>(k)]);
  }
  if (!s.ok()) {  // the stripes posted already are waited for, so their buffers stay valid
    for (auto& w : r.works) {
      if (w) WaitWork(w, r.what, waits_);
    }
    r.works.clear();
    free_.push_back(*request);
  }
  return s;
}

Status GlooTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                               int* request) {
  return Post(true, spans, esize, peer, tag, request);
}

Status GlooTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                               int* request) {
  return Post(false, spans, esize, peer, tag, request);
}

Status GlooTransport::Wait(int request) {
  Request& r = requests_[static_cast<size_t>(request)];
  Status s;
  for (auto& w : r.works) {  // every stripe, even after one failed: its buffer is the caller's
    Status one = w ? WaitWork(w, r.what, waits_) : Status::Ok();
    if (s.ok()) s = one;
  }
  if (s.ok() && !r.unpack.empty()) {
    const char* p = r.staging.data();
    for (const Span& u : r.unpack) {
      std::memcpy(u.data, p, static_cast<size_t>(u.count));
      p += u.count;
    }
  }
  r.works.clear();
  r.unpack.clear();
  free_.push_back(request);
  return s;
}

}  // namespace hvdl
