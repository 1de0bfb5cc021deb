// The work split of a batched copy/scale over many regions, shared by the CUDA kernel
// (backends/cuda/batch_copy_kernels.cu) and its CPU reference (comm/host_device_ops.cc), so unit
// tests on machines without a GPU exercise the same index arithmetic the kernel runs.
//
// Protocol. Every region is cut into tiles of kTileElements elements; tiles are numbered across
// regions in order, and tile_start[i] is the number of the first tile of region i (a prefix sum
// with tile_start[n] = total tiles, computed once on the host). A CUDA thread block takes tile t,
// finds its region with a binary search over tile_start, and its threads stride over the tile's
// elements. Regions with zero elements own no tiles and are never visited. Invariant: every
// element of every region belongs to exactly one tile.
#pragma once

#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define HVDL_HOST_DEVICE __host__ __device__
#else
#define HVDL_HOST_DEVICE
#endif

namespace hvdl {
namespace batch {

constexpr int64_t kTileElements = 4096;

HVDL_HOST_DEVICE inline int64_t TilesOf(int64_t count) {
  return count <= 0 ? 0 : (count + kTileElements - 1) / kTileElements;
}

// The region owning `tile`: the last i in [0, n) with tile_start[i] <= tile. Requires
// 0 <= tile < tile_start[n]. Empty regions share their tile_start with the next region, so the
// "last" such i is the non-empty one.
HVDL_HOST_DEVICE inline int FindRegion(const int64_t* tile_start, int n, int64_t tile) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// The element range [*first, *last) of region `r` (of `count` elements) that `tile` covers.
HVDL_HOST_DEVICE inline void TileRange(const int64_t* tile_start, int r, int64_t tile,
                                       int64_t count, int64_t* first, int64_t* last) {
  *first = (tile - tile_start[r]) * kTileElements;
  *last = *first + kTileElements < count ? *first + kTileElements : count;
}

// tile_start for regions of the given element counts (n + 1 entries).
inline std::vector<int64_t> TileStarts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> starts(counts.size() + 1, 0);
  for (size_t i = 0; i < counts.size(); ++i) starts[i + 1] = starts[i] + TilesOf(counts[i]);
  return starts;
}

}  // namespace batch
}  // namespace hvdl
