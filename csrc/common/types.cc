#include "common/types.h"

#include <sstream>

namespace hvdl {

size_t DataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8:
    case DataType::kInt8:
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBool: return "bool";
  }
  return "unknown";
}

bool IsFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 ||
         dtype == DataType::kFloat32 || dtype == DataType::kFloat64;
}

bool IsValidDataType(int32_t value) { return value >= 0 && value < kNumDataTypes; }

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

bool IsValidReduceOp(int32_t value) { return value >= 0 && value <= 5; }

const char* OpTypeName(OpType op) {
  switch (op) {
    case OpType::kAllreduce: return "allreduce";
    case OpType::kAllgather: return "allgather";
    case OpType::kBroadcast: return "broadcast";
    case OpType::kAlltoall: return "alltoall";
    case OpType::kReducescatter: return "reducescatter";
    case OpType::kBarrier: return "barrier";
    case OpType::kJoin: return "join";
    case OpType::kProcessSetAdd: return "add_process_set";
    case OpType::kProcessSetRemove: return "remove_process_set";
    case OpType::kShutdown: return "shutdown";
  }
  return "unknown";
}

namespace {

// True if `name`'s first word (up to the first '.') is `op` or ends in "_<op>".
bool InOpNamespace(std::string_view op, std::string_view name) {
  const std::string_view word = name.substr(0, name.find('.'));
  if (word.size() < op.size() || word.substr(word.size() - op.size()) != op) return false;
  return word.size() == op.size() || word[word.size() - op.size() - 1] == '_';
}

}  // namespace

void AppendTensorLabel(std::string_view op, std::string_view name, std::string* out) {
  if (InOpNamespace(op, name)) {
    out->append(name);
    return;
  }
  out->append(op).append(" '").append(name).append("'");
}

std::string TensorLabel(std::string_view op, std::string_view name) {
  std::string out;
  AppendTensorLabel(op, name, &out);
  return out;
}

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeString(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? "," : "") << shape[i];
  os << "]";
  return os.str();
}

std::string DescribeTensor(DataType dtype, const Shape& shape) {
  return std::string(DataTypeName(dtype)) + ShapeString(shape);
}

std::string DeviceName(int device) {
  return device == kCpuDevice ? "cpu" : "cuda:" + std::to_string(device);
}

}  // namespace hvdl
