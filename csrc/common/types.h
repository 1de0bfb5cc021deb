// Framework-neutral vocabulary: element types, reduction ops, collective kinds, shapes.
// Element-type templates live only in the reduce kernels; everything else passes DataType.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hvdl {

enum class DataType : int32_t {
  kUInt8 = 0,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kBool,
};
constexpr int kNumDataTypes = 10;

// Values are horovod.torch's public constants.
enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

enum class OpType : int32_t {
  kAllreduce = 0,
  kAllgather,
  kBroadcast,
  kAlltoall,
  kReducescatter,
  kBarrier,
  kJoin,
  kProcessSetAdd,
  kProcessSetRemove,
  kShutdown,  // internal: carries a rank's reason for stopping the job
};

constexpr int kCpuDevice = -1;

using Shape = std::vector<int64_t>;

size_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);  // torch spelling: "float32", "bfloat16", ...
bool IsFloatingPoint(DataType dtype);
bool IsValidDataType(int32_t value);
const char* ReduceOpName(ReduceOp op);
bool IsValidReduceOp(int32_t value);
const char* OpTypeName(OpType op);  // "allreduce", "allgather", ...
// How messages name an op's tensor. horovodlite.torch names collectives "<op>.<user name>"
// ("allreduce.x", "grouped_allreduce.x.0", "barrier.0.3"): a name whose first word is the op's
// name or ends in "_<op>" is shown as it is; any other (internal names, names given to the core
// directly) as "<op> '<name>'". AppendTensorLabel appends the same to `out`.
std::string TensorLabel(std::string_view op, std::string_view name);
void AppendTensorLabel(std::string_view op, std::string_view name, std::string* out);

int64_t NumElements(const Shape& shape);
// "float32[4,5]"; a 0-d tensor prints as "float32[]".
std::string ShapeString(const Shape& shape);
std::string DescribeTensor(DataType dtype, const Shape& shape);
std::string DeviceName(int device);  // "cpu" or "cuda:N"

}  // namespace hvdl
