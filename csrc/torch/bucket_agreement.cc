// Whether a bucket goes out whole or member by member is one decision of all ranks
// (grad_reducer.h, step 6; docs/bucket_views.md).
//
// A bucket breaks on a rank when one of its members cannot join it there this step: frozen or
// removed since the layout, a sparse gradient, one of another dtype, device or shape. Its
// members then go out one by one - under other names than the whole bucket on a device or with
// two ranks or fewer, and without the member that cannot go out at all. If another rank sent the
// bucket whole, each rank would wait for names the other never sends.
//
// So a rank that broke a bucket first sends a marker under every name the whole bucket goes out
// under (its own name, or on the host from three ranks on its members' names): the bucket's
// dtype, on the host, with no elements, shaped [0, k + 1] where k is the first member (its
// position in the bucket) that cannot join. Then, at synchronize, it waits for the markers:
//  - every rank broke the bucket because of the same member: the markers complete (nothing is
//    sent) and the members go out one by one on every rank;
//  - some rank sent the bucket whole, or broke it because of another member: the core finds the
//    shapes (or placement) differ under one name and fails that name on every rank, with every
//    rank's shape. No member of that bucket goes out, and each rank raises the mismatch,
//    explained: the bucket, the parameter k names on the ranks that broke it (read back from
//    their marker's shape), and on a rank that broke it, why.
// A marker costs one negotiation, only in a step in which a bucket broke; the steps in which
// every bucket goes out whole send nothing more.
#include <ATen/ops/empty.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/errors.h"
#include "torch/grad_reducer.h"
#include "torch/grad_reducer_state.h"

namespace hvdl {

bool GradReducer::UnderItsNameLocked(const Bucket& b) const {
  if (!b.device.is_cpu()) return true;
  const std::vector<int> members =
      hooks_.context().process_sets().Members(spec_.process_set).value_or(std::vector<int>{});
  return members.size() <= 2;
}

void GradReducer::SubmitMarkersLocked(Bucket& b) {
  if (!b.markers.empty() || b.broken_at < 0) return;
  try {
    Context& ctx = hooks_.context();
    CheckMembership(ctx, spec_.process_set, OpType::kAllreduce, b.label);
    // The names LaunchBucketLocked sends the whole bucket under.
    std::vector<std::string> names;
    if (UnderItsNameLocked(b)) {
      names.push_back(b.negotiated);
    } else {
      for (int i : b.members) names.push_back(params_[static_cast<size_t>(i)].negotiated);
    }
    // On the host whatever the bucket's device: nothing is sent, and no device path sees an
    // empty tensor. A rank that sent a device bucket whole then differs in placement.
    const at::Tensor marker = at::empty({0, b.broken_at + 1}, at::TensorOptions().dtype(b.dtype));
    for (const std::string& name : names) {
      b.markers.push_back(SubmitAllreduceInplace(ctx, spec_, marker, name, site_));
    }
  } catch (...) {
    if (!launch_error_) launch_error_ = std::current_exception();
    b.refused = true;  // the others' markers or bucket fail by the stall inspector, named
  }
}

std::exception_ptr GradReducer::BucketErrorLocked(const Bucket& b, const Status& status) const {
  std::string message = status.message();
  if (status.code() == StatusCode::kMismatch) {
    std::vector<std::string> members;
    for (int i : b.members) members.push_back(params_[static_cast<size_t>(i)].name);
    // The ranks that broke the bucket, and the member each names: "rank 2 float32[0,3]".
    static const std::regex marker(R"(rank (\d+) [A-Za-z0-9_]+\[0,(\d+)\])");
    std::set<int> broke;
    std::ostringstream named;
    for (std::sregex_iterator it(message.begin(), message.end(), marker), end; it != end; ++it) {
      const int rank = std::stoi((*it)[1].str());
      const size_t k = static_cast<size_t>(std::stoi((*it)[2].str())) - 1;
      if (!broke.insert(rank).second) continue;
      named << (broke.size() > 1 ? "; " : "") << "rank " << rank << ": parameter '"
            << (k < members.size() ? members[k] : std::string("?")) << "'";
    }
    std::ostringstream os;
    os << message << "\nDistributedOptimizer: the ranks disagree on gradient bucket '" << b.label
       << "' (parameters";
    for (size_t k = 0; k < members.size(); ++k) os << (k ? ", '" : " '") << members[k] << "'";
    os << "): some ranks send it whole, others cannot this step because one of its parameters "
          "cannot join it there";
    if (!broke.empty()) os << " (" << named.str() << ")";
    if (b.broken && !b.fallback.empty()) {
      os << ". Here";
      try {
        os << ", on rank " << hooks_.context().topology().rank;
      } catch (...) {  // shut down meanwhile: the rank is in the message already
      }
      os << ": " << b.fallback;
    }
    os << ". Freeze or unfreeze a parameter, change its dtype, device or shape, remove it, or give "
          "it a sparse gradient on every rank at the same step. No gradient of this bucket was "
          "reduced this step.";
    message = os.str();
  }
  try {
    ThrowIfError(Status(status.code(), message));
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

}  // namespace hvdl
