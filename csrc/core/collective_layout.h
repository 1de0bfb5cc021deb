// Element layouts of the fused gather-type collectives (allgather, reducescatter, alltoall):
// output shapes, per-member element counts and the regions packed into / unpacked from the
// member-major fusion buffer. The host executor and the device executor compute exactly the same
// layout and differ only in how they move bytes (memcpy/ScaleCopy vs one batched device launch),
// so the arithmetic lives here once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/device_ops.h"
#include "common/types.h"
#include "core/message.h"

namespace hvdl {

// Elements per dim-0 row.
int64_t Trailing(const Shape& shape);
// Rows of a dim-0 split of `rows` across `n` members: the first rows % n get one extra.
int64_t RowsOf(int64_t rows, int n, int m);
// `elems` elements of `esize` bytes past `base`.
char* At(void* base, int64_t elems, size_t esize);

struct FusedLayout {
  std::vector<Shape> out_shapes;  // per tensor, what this rank receives
  std::vector<int64_t> counts;    // elements per member, over every tensor
  std::vector<int64_t> displs;    // allgather: where member m's block starts in the buffer
  int64_t total = 0;              // elements over every member
};

// Allgather of tensors `rs`: member m contributes r.sizes[m] rows of each. The buffer is
// member-major: member m's block holds its rows of every tensor, tensor by tensor.
FusedLayout AllgatherLayout(const std::vector<const Response*>& rs, int n);
// This rank's rows of every tensor (`inputs`) into its block of `buf`.
std::vector<CopyRegion> AllgatherPack(const std::vector<const Response*>& rs,
                                      const std::vector<const void*>& inputs,
                                      const FusedLayout& layout, int me, void* buf, size_t esize);
// Every member's block of `buf` into the tensors' `outputs`.
std::vector<CopyRegion> AllgatherUnpack(const std::vector<const Response*>& rs,
                                        const std::vector<void*>& outputs,
                                        const FusedLayout& layout, const void* buf, size_t esize);

// Reducescatter of tensors `rs`: each is split by dim-0 rows (RowsOf) across the n members; the
// send buffer is member-major (block m holds member m's rows of every tensor).
FusedLayout ReducescatterLayout(const std::vector<const Response*>& rs, int n, int me);
std::vector<CopyRegion> ReducescatterPack(const std::vector<const Response*>& rs,
                                          const std::vector<const void*>& inputs, int n,
                                          void* buf, size_t esize);

// Alltoall of one tensor: r.sizes is the n x n row matrix (row i: what member i sends to each).
struct AlltoallLayout {
  std::vector<int64_t> send, recv;  // elements to / from each member
  std::vector<int64_t> received;    // rows from each member (returned to the user)
  Shape out_shape;
};
AlltoallLayout PlanAlltoall(const Response& r, int n, int me);

}  // namespace hvdl
