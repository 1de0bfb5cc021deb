#include "core/response_builder.h"

#include <functional>
#include <sstream>

namespace hvdl {
namespace {

// Formats "rank 0 float32[4,4], rank 2 float32[4,5]" listing every submitting rank.
std::string ListValues(const std::vector<const Request*>& reqs,
                       const std::function<std::string(const Request&)>& value) {
  std::ostringstream os;
  bool first = true;
  for (const Request* q : reqs) {
    if (q == nullptr) continue;
    os << (first ? "" : ", ") << "rank " << q->rank << " " << value(*q);
    first = false;
  }
  return os.str();
}

using Field = std::function<std::string(const Request&)>;

// Returns true (and fills `error`) if `key` differs between any two submitting ranks. The message
// lists every rank's `shown` value (often more than the key, e.g. dtype and shape together).
bool Differs(const std::vector<const Request*>& reqs, const Request& ref, const char* what,
             const Field& key, const Field& shown, const std::string& hint, std::string* error) {
  std::string expect = key(ref);
  for (const Request* q : reqs) {
    if (q != nullptr && key(*q) != expect) {
      std::ostringstream os;
      os << TensorLabel(OpTypeName(ref.op), ref.name) << ": " << what << " mismatch: "
         << ListValues(reqs, shown) << "; " << hint;
      *error = os.str();
      return true;
    }
  }
  return false;
}

bool Differs(const std::vector<const Request*>& reqs, const Request& ref, const char* what,
             const Field& key, const std::string& hint, std::string* error) {
  return Differs(reqs, ref, what, key, key, hint, error);
}

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string TrailingShape(const Request& q) {
  Shape trailing(q.shape.begin() + (q.shape.empty() ? 0 : 1), q.shape.end());
  return std::string(DataTypeName(q.dtype)) + "[*" + (trailing.empty() ? "" : ",") +
         ShapeString(trailing).substr(1);
}

// Ranks must agree on the placement, not on the device index: rank 0 on cuda:0 and rank 1 on
// cuda:1 is the usual one-GPU-per-process layout.
std::string Placement(const Request& q) { return q.device == kCpuDevice ? "cpu" : "cuda"; }

// The checks every op shares, then the op-specific ones. Returns the first error found.
std::string Validate(const std::vector<const Request*>& reqs, const Request& ref) {
  std::string err;
  const std::string same = "every rank must submit the same ";
  if (Differs(reqs, ref, "operation", [](const Request& q) { return OpTypeName(q.op); },
              "every rank must use one operation per name.", &err) ||
      Differs(reqs, ref, "device", Placement, [](const Request& q) { return DeviceName(q.device); },
              "keep the tensor on the same kind of device (CPU or GPU) on every rank.", &err)) {
    return err;
  }
  Field dtype = [](const Request& q) { return std::string(DataTypeName(q.dtype)); };
  Field shape = [](const Request& q) { return ShapeString(q.shape); };
  Field full = [](const Request& q) { return DescribeTensor(q.dtype, q.shape); };
  Field trailing = TrailingShape;
  switch (ref.op) {
    case OpType::kAllreduce:
    case OpType::kReducescatter:
      if (Differs(reqs, ref, "dtype", dtype, full, same + "dtype under one name.", &err) ||
          Differs(reqs, ref, "shape", shape, full, same + "shape under one name.", &err) ||
          Differs(reqs, ref, "reduce op",
                  [](const Request& q) { return ReduceOpName(q.reduce_op); },
                  same + "op under one name.", &err) ||
          Differs(reqs, ref, "prescale_factor", [](const Request& q) { return Num(q.prescale); },
                  same + "prescale_factor under one name.", &err) ||
          Differs(reqs, ref, "postscale_factor",
                  [](const Request& q) { return Num(q.postscale); },
                  same + "postscale_factor under one name.", &err)) {
        return err;
      }
      break;
    case OpType::kBroadcast:
      if (Differs(reqs, ref, "dtype", dtype, full, same + "dtype under one name.", &err) ||
          Differs(reqs, ref, "shape", shape, full, same + "shape under one name.", &err) ||
          Differs(reqs, ref, "root rank", [](const Request& q) { return std::to_string(q.root); },
                  "every rank must name the same root_rank.", &err)) {
        return err;
      }
      break;
    case OpType::kAllgather:
    case OpType::kAlltoall:
      if (Differs(reqs, ref, "dtype", dtype, full, same + "dtype under one name.", &err) ||
          Differs(reqs, ref, "number of dimensions",
                  [](const Request& q) { return std::to_string(q.shape.size()); }, full,
                  "every rank must submit tensors with the same number of dimensions.", &err) ||
          Differs(reqs, ref, "trailing dimensions", trailing, full,
                  "only the first dimension may differ between ranks.", &err)) {
        return err;
      }
      break;
    case OpType::kProcessSetAdd:
    case OpType::kProcessSetRemove:
      Differs(reqs, ref, "process set",
              [](const Request& q) { return ShapeString(q.splits); },
              "every rank must pass the same ranks (or set) to add_process_set/remove_process_set.",
              &err);
      break;
    default:
      break;
  }
  return err;
}

}  // namespace

Response BuildResponse(const std::vector<const Request*>& requests,
                       const std::vector<int>& members) {
  const Request* ref = nullptr;
  std::vector<int> joined;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i] == nullptr) {
      joined.push_back(members[i]);
    } else if (ref == nullptr) {
      ref = requests[i];
    }
  }
  Response resp;
  resp.op = ref->op;
  resp.name = ref->name;
  resp.dtype = ref->dtype;
  resp.shape = ref->shape;
  resp.reduce_op = ref->reduce_op;
  resp.prescale = ref->prescale;
  resp.postscale = ref->postscale;
  resp.root = ref->root;
  resp.device = ref->device;
  resp.process_set = ref->process_set;

  std::string err = Validate(requests, *ref);
  if (err.empty() && !joined.empty() && ref->op != OpType::kAllreduce &&
      ref->op != OpType::kBarrier) {
    std::ostringstream os;
    os << TensorLabel(OpTypeName(ref->op), ref->name) << ": rank";
    os << (joined.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < joined.size(); ++i) os << (i ? "," : "") << joined[i];
    os << (joined.size() > 1 ? " have" : " has") << " already called hvd.join() and cannot take "
       << "part; only allreduce and barrier continue while ranks have joined.";
    err = os.str();
  }
  if (!err.empty()) {
    resp.error = err;
    resp.error_code = StatusCode::kMismatch;
    return resp;
  }

  const size_t n = requests.size();
  if (ref->op == OpType::kProcessSetAdd || ref->op == OpType::kProcessSetRemove) {
    resp.sizes = ref->splits;
  } else if (ref->op == OpType::kAllgather) {
    for (const Request* q : requests) resp.sizes.push_back(q->shape.empty() ? 1 : q->shape[0]);
  } else if (ref->op == OpType::kAlltoall) {
    resp.sizes.reserve(n * n);
    for (const Request* q : requests) resp.sizes.insert(resp.sizes.end(), q->splits.begin(), q->splits.end());
  }
  return resp;
}

}  // namespace hvdl
