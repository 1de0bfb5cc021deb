#include "torch/adapter.h"

#include "runtime/build_info.h"

namespace hvdl {
namespace {

// The name Python users know ("torch.complex64"), not the C++ enum's ("ComplexFloat").
std::string TorchDtypeName(at::ScalarType type) {
  switch (type) {
    case at::kComplexHalf: return "torch.complex32";
    case at::kComplexFloat: return "torch.complex64";
    case at::kComplexDouble: return "torch.complex128";
    case at::kUInt16: return "torch.uint16";
    case at::kUInt32: return "torch.uint32";
    case at::kUInt64: return "torch.uint64";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    default: return std::string("torch.") + c10::toString(type);
  }
}

}  // namespace

Status ToDataType(const at::Tensor& t, DataType* out) {
  switch (t.scalar_type()) {
    case at::kByte: *out = DataType::kUInt8; break;
    case at::kChar: *out = DataType::kInt8; break;
    case at::kShort: *out = DataType::kInt16; break;
    case at::kInt: *out = DataType::kInt32; break;
    case at::kLong: *out = DataType::kInt64; break;
    case at::kHalf: *out = DataType::kFloat16; break;
    case at::kBFloat16: *out = DataType::kBFloat16; break;
    case at::kFloat: *out = DataType::kFloat32; break;
    case at::kDouble: *out = DataType::kFloat64; break;
    case at::kBool: *out = DataType::kBool; break;
    default:
      return Status::InvalidArgument("unsupported dtype " + TorchDtypeName(t.scalar_type()));
  }
  return Status::Ok();
}

TensorRef ToRef(const at::Tensor& t, DataType dtype) {
  TensorRef r;
  r.data = t.data_ptr();
  r.dtype = dtype;
  r.shape.assign(t.sizes().begin(), t.sizes().end());
  r.device = t.is_cuda() ? t.get_device() : kCpuDevice;
  return r;
}

Status CheckTensor(const at::Tensor& t, const std::string& op, const std::string& name) {
  // Built only for an error: this check runs for every tensor of every step.
  auto what = [&] { return TensorLabel(op, name); };
  if (!t.defined()) return Status::InvalidArgument(what() + ": the tensor is undefined (None).");
  DataType dtype;
  Status s = ToDataType(t, &dtype);
  if (!s.ok()) {
    return Status::InvalidArgument(what() + ": " + s.message() +
                                   "; supported: uint8, int8, int16, int32, int64, float16, "
                                   "bfloat16, float32, float64, bool.");
  }
  if (!t.is_contiguous()) {
    return Status::InvalidArgument(what() + ": the tensor is not contiguous; pass "
                                   "tensor.contiguous().");
  }
  if (t.is_sparse()) {
    return Status::InvalidArgument(what() + ": sparse tensors go through "
                                   "hvd.sparse_allreduce_async.");
  }
  if (t.device().is_cpu()) return Status::Ok();
  if (!t.is_cuda()) {
    return Status::InvalidArgument(what() + ": tensors on " + t.device().str() +
                                   " are not supported; horovodlite runs collectives on CPU and "
                                   "CUDA tensors.");
  }
  if (!CudaBuilt()) {
    return Status::InvalidArgument(
        what() + ": the tensor is on " + t.device().str() + ", but this horovodlite build is "
        "CPU-only (built without CUDA; hvd.cuda_built() is False). Rebuild it against a CUDA "
        "build of torch with nvcc available (see docker/README.md), or move the tensor to the "
        "CPU.");
  }
  return Status::Ok();
}

Status CheckSameDevice(const std::vector<at::Tensor>& tensors, const std::string& op,
                       const std::vector<std::string>& names) {
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].device() != tensors[0].device()) {
      return Status::InvalidArgument(
          op + ": all tensors of one grouped operation must be on one device, but '" + names[0] +
          "' is on " + tensors[0].device().str() + " and '" + names[i] + "' on " +
          tensors[i].device().str() + "; group them by device.");
    }
  }
  return Status::Ok();
}

}  // namespace hvdl
