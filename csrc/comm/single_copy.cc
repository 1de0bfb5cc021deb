#include "comm/single_copy.h"

#include <algorithm>
#include <cstring>
#include <string>

#if defined(__linux__)
#include <sys/uio.h>

#include <cerrno>
#endif

namespace hvdl {
namespace {

#if defined(__linux__)
constexpr size_t kIovMax = 1024;  // Linux's IOV_MAX: iovecs per process_vm_readv call

std::vector<iovec> ToIovecs(const std::vector<Span>& pieces) {
  std::vector<iovec> out;
  out.reserve(pieces.size());
  for (const Span& s : pieces) out.push_back({s.data, static_cast<size_t>(s.count)});
  return out;
}

// Moves the cursor (`*index` into `iov`) past `bytes` bytes and any empty pieces.
void Advance(std::vector<iovec>* iov, size_t* index, size_t bytes) {
  while (*index < iov->size() && (bytes > 0 || (*iov)[*index].iov_len == 0)) {
    iovec& v = (*iov)[*index];
    const size_t step = std::min(bytes, v.iov_len);
    v.iov_base = static_cast<char*>(v.iov_base) + step;
    v.iov_len -= step;
    bytes -= step;
    if (v.iov_len == 0) ++*index;
  }
}
#endif

}  // namespace

bool SingleCopyBuilt() {
#if defined(__linux__)
  return true;
#else
  return false;
#endif
}

Status ReadFromProcess(int64_t pid, const std::vector<Span>& local,
                       const std::vector<Span>& remote) {
  const int64_t want = TotalCount(remote), room = TotalCount(local);
  if (want != room) {
    return Status::Internal("single copy of " + std::to_string(want) + " bytes into " +
                            std::to_string(room) + " bytes");
  }
#if defined(__linux__)
  std::vector<iovec> l = ToIovecs(local), r = ToIovecs(remote);
  size_t li = 0, ri = 0;
  Advance(&l, &li, 0);
  Advance(&r, &ri, 0);
  // process_vm_readv may stop early at an iovec boundary: continue from there.
  while (li < l.size() && ri < r.size()) {
    const ssize_t got = process_vm_readv(static_cast<pid_t>(pid), &l[li],
                                         std::min(l.size() - li, kIovMax), &r[ri],
                                         std::min(r.size() - ri, kIovMax), 0);
    if (got < 0) {
      return Status::Internal("single-copy read from pid " + std::to_string(pid) +
                              " failed: " + std::strerror(errno) +
                              " (set HOROVOD_RING_CMA=0 to use MPI messages)");
    }
    if (got == 0) return Status::Internal("single-copy read made no progress");
    Advance(&l, &li, static_cast<size_t>(got));
    Advance(&r, &ri, static_cast<size_t>(got));
  }
  return Status::Ok();
#else
  return Status::Internal("single copy between processes is not available on this platform");
#endif
}

}  // namespace hvdl
