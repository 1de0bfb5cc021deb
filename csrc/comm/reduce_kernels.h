// CPU reduction and scaling kernels: the only place element types are templates.
//
// float16 and bfloat16 are widened to float32 for every operation and rounded back once
// (round-to-nearest-even). Integer scaling happens in float64 and truncates toward zero, as
// Horovod does. bool supports Min (and), Max (or), Sum (or) and Product (and).
#pragma once

#include <cstdint>

#include "common/types.h"

namespace hvdl {

// dst[i] = dst[i] (op) src[i]. `op` is kSum, kMin, kMax or kProduct (kAverage reduces as kSum).
void ReduceInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op);
// ReduceInto, then Scale by `factor`: one pass over the data for float32/float64 Sum (the same
// bits as the two calls), the two calls otherwise.
void ReduceScaleInto(void* dst, const void* src, int64_t count, DataType dtype, ReduceOp op,
                     double factor);
// buf[i] *= factor.
void Scale(void* buf, int64_t count, DataType dtype, double factor);
// dst[i] = src[i] * factor (a plain copy when factor == 1).
void ScaleCopy(void* dst, const void* src, int64_t count, DataType dtype, double factor);
// True for the (dtype, op) pairs ReduceInto implements.
bool ReduceSupported(DataType dtype, ReduceOp op);

float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

}  // namespace hvdl
