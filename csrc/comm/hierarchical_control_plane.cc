#include "comm/hierarchical_control_plane.h"

#include <cstring>

#include "comm/posted_requests.h"

namespace hvdl {
namespace {

void PutWord(std::string* out, uint64_t v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

bool GetWord(const std::string& in, size_t* at, uint64_t* v) {
  if (in.size() - *at < sizeof(*v)) return false;
  std::memcpy(v, in.data() + *at, sizeof(*v));
  *at += sizeof(*v);
  return true;
}

}  // namespace

Status HierarchicalControlPlane::Create(std::unique_ptr<ControlPlane> local,
                                        std::unique_ptr<Transport> cross,
                                        const HierarchicalLayout& layout,
                                        std::unique_ptr<HierarchicalControlPlane>* out) {
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("hierarchical control plane: " + what);
  };
  if (local == nullptr) return bad("no local control plane");
  const size_t l = static_cast<size_t>(local->size());
  if (layout.local_ranks.size() != l || layout.root_ranks.empty() || layout.size < 1) {
    return bad(std::to_string(layout.local_ranks.size()) + " local ranks for a local control "
               "plane of " + std::to_string(l) + ", " + std::to_string(layout.root_ranks.size()) +
               " roots, job size " + std::to_string(layout.size));
  }
  for (int r : layout.local_ranks) {
    if (r < 0 || r >= layout.size) return bad("local rank " + std::to_string(r) + " out of range");
    if (r == 0 && layout.local_ranks[0] != 0) {
      return bad("global rank 0 must be member 0 of its host's local control plane");
    }
  }
  if (layout.root_ranks[0] != 0) return bad("cross member 0 must be global rank 0's host");
  const bool is_root = local->rank() == 0;
  const bool several = layout.root_ranks.size() > 1;
  if (is_root && several) {
    if (cross == nullptr) return bad("a root of a job on several hosts needs a cross transport");
    if (static_cast<size_t>(cross->size()) != layout.root_ranks.size() ||
        layout.root_ranks[static_cast<size_t>(cross->rank())] != layout.local_ranks[0]) {
      return bad("cross member " + std::to_string(cross->rank()) + " of " +
                 std::to_string(cross->size()) + " is global rank " +
                 std::to_string(layout.local_ranks[0]) + ", but the layout names " +
                 std::to_string(layout.root_ranks.size()) + " roots");
    }
  } else if (cross != nullptr && (!is_root || cross->size() > 1)) {
    return bad("a cross transport on a member that is not the root of one of several hosts");
  }
  if (layout.cross_tag < 0 || layout.cross_tag >= Transport::kTags) return bad("cross tag");
  out->reset(new HierarchicalControlPlane(std::move(local), std::move(cross), layout));
  return Status::Ok();
}

HierarchicalControlPlane::HierarchicalControlPlane(std::unique_ptr<ControlPlane> local,
                                                   std::unique_ptr<Transport> cross,
                                                   const HierarchicalLayout& layout)
    : local_(std::move(local)), cross_(std::move(cross)), layout_(layout) {
  rank_ = layout_.local_ranks[static_cast<size_t>(local_->rank())];
  if (cross_ != nullptr && cross_->size() < 2) cross_.reset();
}

Status HierarchicalControlPlane::Step(const char* what, const Status& s) const {
  if (s.ok()) return s;
  return Status(s.code(), std::string("hierarchical control plane (rank ") +
                              std::to_string(rank_) + "), " + what + ": " + s.message());
}

Status HierarchicalControlPlane::StartBitwiseOr(uint64_t* words, size_t n) {
  if (phase_ != Phase::kIdle) {
    return Status::Internal("hierarchical control plane: a bitwise OR is already outstanding");
  }
  words_ = words;
  n_ = n;
  HVDL_RETURN_IF_ERROR(Step("bitwise OR inside the host", local_->StartBitwiseOr(words, n)));
  phase_ = Phase::kHost;
  return Status::Ok();
}

Status HierarchicalControlPlane::TestBitwiseOr(bool* done) {
  *done = false;
  if (phase_ == Phase::kIdle) {
    return Status::Internal("hierarchical control plane: no bitwise OR outstanding");
  }
  bool local_done = false;
  if (phase_ == Phase::kHost) {
    // Step 1: the host's OR.
    Status s = local_->TestBitwiseOr(&local_done);
    if (!s.ok() || !local_done) {
      if (!s.ok()) phase_ = Phase::kIdle;
      return Step("bitwise OR inside the host", s);
    }
    if (hosts() == 1) {
      phase_ = Phase::kIdle;
      *done = true;
      return Status::Ok();
    }
    // Step 2: the job's OR at the roots; zeros elsewhere.
    if (root()) {
      s = Step("bitwise OR across hosts", CrossOr());
    } else if (n_ > 0) {
      std::memset(words_, 0, n_ * sizeof(uint64_t));
    }
    // Step 3: the roots hand the job's OR to their hosts.
    if (s.ok()) s = Step("publishing the job's bitwise OR", local_->StartBitwiseOr(words_, n_));
    if (!s.ok()) {
      phase_ = Phase::kIdle;
      return s;
    }
    phase_ = Phase::kJob;
  }
  Status s = local_->TestBitwiseOr(&local_done);
  if (!s.ok() || local_done) phase_ = Phase::kIdle;
  *done = s.ok() && local_done;
  return Step("publishing the job's bitwise OR", s);
}

// Roots only: OR of every host's words at cross member 0, sent back to every root. Blocking.
// Every request is waited for on every path (transport.h): the buffers are members.
Status HierarchicalControlPlane::CrossOr() {
  const int tag = layout_.cross_tag;
  const int64_t bytes = static_cast<int64_t>(n_ * sizeof(uint64_t));
  PostedRequests posted(cross_.get());
  if (cross_->rank() != 0) {
    HVDL_RETURN_IF_ERROR(posted.Send({Span{words_, bytes}}, 1, 0, tag));
    HVDL_RETURN_IF_ERROR(posted.WaitAll());  // before words_ is overwritten by the result
    HVDL_RETURN_IF_ERROR(posted.Recv({Span{words_, bytes}}, 1, 0, tag));
    return posted.WaitAll();
  }
  const int hosts = cross_->size();
  scratch_.assign(static_cast<size_t>(hosts - 1) * n_, 0);
  for (int h = 1; h < hosts; ++h) {
    HVDL_RETURN_IF_ERROR(posted.Recv(
        {Span{scratch_.data() + static_cast<size_t>(h - 1) * n_, bytes}}, 1, h, tag));
  }
  HVDL_RETURN_IF_ERROR(posted.WaitAll());
  for (size_t i = 0; i < scratch_.size(); ++i) words_[i % n_] |= scratch_[i];
  for (int h = 1; h < hosts; ++h) {
    HVDL_RETURN_IF_ERROR(posted.Send({Span{words_, bytes}}, 1, h, tag));
  }
  return posted.WaitAll();
}

Status HierarchicalControlPlane::Gather(const std::string& send, std::vector<std::string>* recv) {
  std::vector<std::string> host;
  HVDL_RETURN_IF_ERROR(Step("gather inside the host", local_->Gather(send, &host)));
  recv->clear();
  if (!root()) return Status::Ok();
  // The host's contributions: (global rank, length, bytes) per member.
  std::string blob;
  for (size_t i = 0; i < host.size(); ++i) {
    PutWord(&blob, static_cast<uint64_t>(layout_.local_ranks[i]));
    PutWord(&blob, host[i].size());
    blob += host[i];
  }
  return Step("gather across hosts", CrossGather(blob, recv));
}

// Roots only: every host's blob to cross member 0 (length first), which places the
// contributions by global rank. Blocking. The receives land in locals: `posted`, declared after
// them, waits for every request on every path before they go (transport.h) - with 3 hosts and
// host 2 lost, host 1's length must not arrive after this returned.
Status HierarchicalControlPlane::CrossGather(const std::string& blob,
                                             std::vector<std::string>* recv) {
  const int tag = layout_.cross_tag;
  const int hosts = cross_ == nullptr ? 1 : cross_->size();
  std::vector<std::string> blobs(static_cast<size_t>(hosts));
  std::vector<uint64_t> lengths(static_cast<size_t>(hosts), 0);
  if (cross_ != nullptr && cross_->rank() != 0) {
    uint64_t& length = lengths[0];
    length = blob.size();
    PostedRequests posted(cross_.get());
    HVDL_RETURN_IF_ERROR(posted.Send({Span{&length, 8}}, 1, 0, tag));
    HVDL_RETURN_IF_ERROR(posted.Send(
        {Span{const_cast<char*>(blob.data()), static_cast<int64_t>(blob.size())}}, 1, 0, tag));
    return posted.WaitAll();
  }
  blobs[0] = blob;
  if (hosts > 1) {
    PostedRequests posted(cross_.get());
    for (int h = 1; h < hosts; ++h) {
      HVDL_RETURN_IF_ERROR(
          posted.Recv({Span{&lengths[static_cast<size_t>(h)], 8}}, 1, h, tag));
    }
    HVDL_RETURN_IF_ERROR(posted.WaitAll());
    for (int h = 1; h < hosts; ++h) {
      std::string& b = blobs[static_cast<size_t>(h)];
      b.resize(lengths[static_cast<size_t>(h)]);
      HVDL_RETURN_IF_ERROR(
          posted.Recv({Span{b.data(), static_cast<int64_t>(b.size())}}, 1, h, tag));
    }
    HVDL_RETURN_IF_ERROR(posted.WaitAll());
  }
  Status s = Place(blobs, recv);
  if (!s.ok()) recv->clear();
  return s;
}

// Cross member 0: every host's (global rank, length, bytes) records into recv[global rank];
// every rank of the job exactly once.
Status HierarchicalControlPlane::Place(const std::vector<std::string>& blobs,
                                       std::vector<std::string>* recv) const {
  recv->assign(static_cast<size_t>(layout_.size), std::string());
  std::vector<uint8_t> seen(static_cast<size_t>(layout_.size), 0);
  for (size_t h = 0; h < blobs.size(); ++h) {
    const std::string& b = blobs[h];
    size_t at = 0;
    uint64_t rank = 0, length = 0;
    while (at < b.size()) {
      if (!GetWord(b, &at, &rank) || !GetWord(b, &at, &length) || b.size() - at < length ||
          rank >= seen.size() || seen[rank]) {
        return Status::Internal("malformed contributions from the root of host " +
                                std::to_string(h) + " (rank " +
                                std::to_string(layout_.root_ranks[h]) + ")");
      }
      seen[rank] = 1;
      (*recv)[rank].assign(b, at, length);
      at += length;
    }
  }
  for (size_t r = 0; r < seen.size(); ++r) {
    if (!seen[r]) {
      return Status::Internal("no contribution from rank " + std::to_string(r) +
                              " (the hosts' layouts do not cover the job)");
    }
  }
  return Status::Ok();
}

Status HierarchicalControlPlane::Broadcast(std::string* data) {
  if (root() && cross_ != nullptr) {
    const int tag = layout_.cross_tag;
    uint64_t length = data->size();
    Status s;
    {
      PostedRequests posted(cross_.get());  // after `length`: drained before it goes
      if (cross_->rank() == 0) {
        for (int h = 1; h < cross_->size() && s.ok(); ++h) {
          s = posted.Send({Span{&length, 8}}, 1, h, tag);
          if (s.ok()) {
            s = posted.Send({Span{data->data(), static_cast<int64_t>(data->size())}}, 1, h,
                            tag);
          }
        }
        if (s.ok()) s = posted.WaitAll();
      } else {
        s = posted.Recv({Span{&length, 8}}, 1, 0, tag);
        if (s.ok()) s = posted.WaitAll();
        if (s.ok()) {
          data->resize(length);
          s = posted.Recv({Span{data->data(), static_cast<int64_t>(length)}}, 1, 0, tag);
        }
        if (s.ok()) s = posted.WaitAll();
      }
    }
    HVDL_RETURN_IF_ERROR(Step("broadcast across hosts", s));
  }
  return Step("broadcast inside the host", local_->Broadcast(data));
}

}  // namespace hvdl
