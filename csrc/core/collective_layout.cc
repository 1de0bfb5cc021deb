#include "core/collective_layout.h"

namespace hvdl {

int64_t Trailing(const Shape& shape) {
  int64_t e = 1;
  for (size_t i = 1; i < shape.size(); ++i) e *= shape[i];
  return e;
}

int64_t RowsOf(int64_t rows, int n, int m) { return rows / n + (m < rows % n ? 1 : 0); }

char* At(void* base, int64_t elems, size_t esize) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(esize);
}

FusedLayout AllgatherLayout(const std::vector<const Response*>& rs, int n) {
  FusedLayout l;
  l.counts.assign(static_cast<size_t>(n), 0);
  for (const Response* r : rs) {
    Shape out = r->shape.empty() ? Shape{0} : r->shape;
    out[0] = 0;
    for (int m = 0; m < n; ++m) {
      out[0] += r->sizes[static_cast<size_t>(m)];
      l.counts[static_cast<size_t>(m)] += r->sizes[static_cast<size_t>(m)] * Trailing(r->shape);
    }
    l.out_shapes.push_back(std::move(out));
  }
  l.displs.assign(static_cast<size_t>(n), 0);
  for (size_t m = 1; m < l.displs.size(); ++m) l.displs[m] = l.displs[m - 1] + l.counts[m - 1];
  l.total = l.displs.back() + l.counts.back();
  return l;
}

std::vector<CopyRegion> AllgatherPack(const std::vector<const Response*>& rs,
                                      const std::vector<const void*>& inputs,
                                      const FusedLayout& layout, int me, void* buf, size_t esize) {
  std::vector<CopyRegion> out;
  int64_t off = layout.displs[static_cast<size_t>(me)];
  for (size_t i = 0; i < rs.size(); ++i) {
    const int64_t c = rs[i]->sizes[static_cast<size_t>(me)] * Trailing(rs[i]->shape);
    out.push_back({At(buf, off, esize), inputs[i], c});
    off += c;
  }
  return out;
}

std::vector<CopyRegion> AllgatherUnpack(const std::vector<const Response*>& rs,
                                        const std::vector<void*>& outputs,
                                        const FusedLayout& layout, const void* buf, size_t esize) {
  std::vector<CopyRegion> out;
  std::vector<int64_t> written(rs.size(), 0);
  void* base = const_cast<void*>(buf);
  for (size_t m = 0; m < layout.displs.size(); ++m) {
    int64_t src = layout.displs[m];
    for (size_t i = 0; i < rs.size(); ++i) {
      const int64_t c = rs[i]->sizes[m] * Trailing(rs[i]->shape);
      out.push_back({At(outputs[i], written[i], esize), At(base, src, esize), c});
      written[i] += c;
      src += c;
    }
  }
  return out;
}

FusedLayout ReducescatterLayout(const std::vector<const Response*>& rs, int n, int me) {
  FusedLayout l;
  l.counts.assign(static_cast<size_t>(n), 0);
  for (const Response* r : rs) {
    Shape out = r->shape;
    out[0] = RowsOf(r->shape[0], n, me);
    for (int m = 0; m < n; ++m) {
      l.counts[static_cast<size_t>(m)] += RowsOf(r->shape[0], n, m) * Trailing(r->shape);
    }
    l.out_shapes.push_back(std::move(out));
  }
  for (int64_t c : l.counts) l.total += c;
  return l;
}

std::vector<CopyRegion> ReducescatterPack(const std::vector<const Response*>& rs,
                                          const std::vector<const void*>& inputs, int n,
                                          void* buf, size_t esize) {
  std::vector<CopyRegion> out;
  std::vector<int64_t> row0(rs.size(), 0);  // first row of member m's share, per tensor
  int64_t dst = 0;
  for (int m = 0; m < n; ++m) {
    for (size_t i = 0; i < rs.size(); ++i) {
      const Response& r = *rs[i];
      const int64_t rows = RowsOf(r.shape[0], n, m);
      const int64_t c = rows * Trailing(r.shape);
      out.push_back({At(buf, dst, esize),
                     At(const_cast<void*>(inputs[i]), row0[i] * Trailing(r.shape), esize), c});
      row0[i] += rows;
      dst += c;
    }
  }
  return out;
}

AlltoallLayout PlanAlltoall(const Response& r, int n, int me) {
  AlltoallLayout l;
  const int64_t e = Trailing(r.shape);
  l.send.assign(static_cast<size_t>(n), 0);
  l.recv.assign(static_cast<size_t>(n), 0);
  l.received.assign(static_cast<size_t>(n), 0);
  l.out_shape = r.shape.empty() ? Shape{0} : r.shape;
  l.out_shape[0] = 0;
  for (int m = 0; m < n; ++m) {
    const int64_t to_m = r.sizes[static_cast<size_t>(me * n + m)];
    const int64_t from_m = r.sizes[static_cast<size_t>(m * n + me)];
    l.send[static_cast<size_t>(m)] = to_m * e;
    l.recv[static_cast<size_t>(m)] = from_m * e;
    l.received[static_cast<size_t>(m)] = from_m;
    l.out_shape[0] += from_m;
  }
  return l;
}

}  // namespace hvdl
