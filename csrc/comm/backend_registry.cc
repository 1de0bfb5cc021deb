#include "comm/backend_registry.h"

namespace hvdl {

void BackendRegistry::Add(std::unique_ptr<DataBackend> backend) {
  backends_.push_back(std::move(backend));
}

std::string BackendRegistry::Names() const {
  std::string names;
  for (const auto& b : backends_) names += (names.empty() ? "" : ", ") + std::string(b->name());
  return names.empty() ? "none" : names;
}

Status BackendRegistry::Select(OpType op, DataType dtype, int device, DataBackend** out) const {
  for (const auto& b : backends_) {
    if (b->Supports(op, dtype, device)) {
      *out = b.get();
      return Status::Ok();
    }
  }
  return Status::Internal(std::string("no backend supports ") + OpTypeName(op) + " of " +
                          DataTypeName(dtype) + " on " + DeviceName(device) +
                          " (backends built: " + Names() + ")");
}

Status BackendRegistry::AddProcessSet(int ps, const std::vector<int>& ranks) {
  for (const auto& b : backends_) HVDL_RETURN_IF_ERROR(b->AddProcessSet(ps, ranks));
  return Status::Ok();
}

Status BackendRegistry::RemoveProcessSet(int ps) {
  for (const auto& b : backends_) HVDL_RETURN_IF_ERROR(b->RemoveProcessSet(ps));
  return Status::Ok();
}

std::vector<DataBackend*> BackendRegistry::all() const {
  std::vector<DataBackend*> out;
  for (const auto& b : backends_) out.push_back(b.get());
  return out;
}

}  // namespace hvdl
