#include "core/timeline_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/logging.h"

namespace hvdl {
namespace {

// The first region of spaces the closing bracket sits behind.
constexpr off_t kInitialRegion = off_t{1} << 20;
// A full region is replaced by a copy with this many times the room. Each growth copies the file
// once, so a larger factor copies less (x4: a third of the content is copied again, x2: all of it)
// at the price of more trailing spaces in the file of a killed job (up to 3/4 of it).
constexpr off_t kGrowth = 4;
// The most one write or read moves (the page-aligned I/O buffer). A direct write has a large
// fixed cost (on a VM: 48-59 us of CPU for a 128 KiB call, 68-79 us for 1 MiB, 218-264 us for
// 4 MiB), so calls are large; not larger, because the writer only yields the CPU on its way back
// to user space: on a kernel without preemption (PREEMPT_NONE, common on servers) a training
// thread waking on the writer's core waits for the current call's CPU part to finish.
constexpr size_t kIoBytes = size_t{1} << 20;

// Opens with O_DIRECT where the filesystem allows it (see timeline.h), else buffered.
int OpenFile(const char* path, int flags) {
  int fd = ::open(path, flags | O_DIRECT, 0644);
  if (fd < 0 && errno == EINVAL) fd = ::open(path, flags, 0644);
  return fd;
}

// pread/pwrite of the whole range, retried on short counts and EINTR. A filesystem that took
// O_DIRECT at open but rejects the transfer (EINVAL) gets the fd switched to buffered I/O.
template <typename Io, typename Buf>
bool Transfer(Io io, int fd, Buf data, size_t n, off_t offset) {
  while (n > 0) {
    ssize_t done = io(fd, data, n, offset);
    if (done < 0 && errno == EINTR) continue;
    if (done < 0 && errno == EINVAL) {
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0 && (flags & O_DIRECT) != 0 && ::fcntl(fd, F_SETFL, flags & ~O_DIRECT) == 0) {
        continue;
      }
    }
    if (done <= 0) return false;
    data += done;
    n -= static_cast<size_t>(done);
    offset += done;
  }
  return true;
}

bool WriteAll(int fd, off_t offset, const char* data, size_t n) {
  return Transfer(::pwrite, fd, data, n, offset);
}

bool ReadAll(int fd, off_t offset, char* data, size_t n) {
  return Transfer(::pread, fd, data, n, offset);
}

// Writes a new version of `path` with `fill(fd)` and puts it in place with rename() (atomic), so
// readers see the old file or the new one, never a partial one. It is built in an unnamed file
// (O_TMPFILE) where the filesystem has them, so a kill meanwhile leaves nothing behind; it is
// named only just before the rename. Returns the new file's fd, or -1 (errno set).
template <typename Fill>
int ReplaceFile(const std::string& path, Fill fill) {
  const std::string tmp = path + ".hvdl-tmp";
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  bool unnamed = true;
  int fd = OpenFile(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    unnamed = false;
    fd = OpenFile(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC);
  }
  bool ok = fd >= 0 && fill(fd);
  if (ok && unnamed) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    ::unlink(tmp.c_str());  // a leftover of an earlier killed run
    ok = ::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, tmp.c_str(), AT_SYMLINK_FOLLOW) == 0;
  }
  ok = ok && ::rename(tmp.c_str(), path.c_str()) == 0;
  if (ok) return fd;
  const int err = errno;
  if (fd >= 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
  }
  errno = err;
  return -1;
}

}  // namespace

Status TimelineFile::Open(const std::string& path) {
  Close();
  const long page = ::sysconf(_SC_PAGESIZE);
  page_ = page > 0 ? static_cast<size_t>(page) : 4096;
  if (!io_) {
    void* buf = nullptr;
    if (::posix_memalign(&buf, page_, 2 * kIoBytes) != 0) {
      return Status::InvalidArgument("timeline: out of memory for the I/O buffer");
    }
    io_.reset(static_cast<char*>(buf));
    std::memset(io_.get() + kIoBytes, ' ', kIoBytes);
  }
  // Like every later version of the file, the first replaces whatever is at `path` in one
  // rename.
  const int fd = ReplaceFile(
      path, [&](int to) { return PutPages(to, 0, kInitialRegion, kInitialRegion - 1, "["); });
  if (fd < 0) {
    const int err = errno;  // before the message is built
    return Status::InvalidArgument("cannot write timeline file '" + path +
                                   "': " + std::strerror(err));
  }
  path_ = path;
  fd_ = fd;
  pos_ = 1;
  head_ = "[";
  end_ = kInitialRegion - 1;
  wrote_any_ = false;
  return Status::Ok();
}

void TimelineFile::Close() {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

void TimelineFile::BeginRound() {
  text_ = head_;
  at_ = pos_;
}

void TimelineFile::EndRound() {
  if (fd_ >= 0) Flush(text_, at_);
}

void TimelineFile::Finish() {
  if (fd_ >= 0 && end_ > pos_ + 2) Rewrite(pos_ + 1, "\n");
}

void TimelineFile::Fail(const char* what) {
  const int err = errno;
  HVDL_LOG(Error) << "timeline '" << path_ << "': " << what << ": " << std::strerror(err)
                  << "; recording stopped (the file keeps what was written before)";
  ::close(fd_);
  fd_ = -1;
}

off_t TimelineFile::PageStart(off_t at) const { return at - at % static_cast<off_t>(page_); }

off_t TimelineFile::PageEnd(off_t at) const {
  return PageStart(at + static_cast<off_t>(page_) - 1);
}

bool TimelineFile::PutPages(int fd, off_t at, off_t upto, off_t bracket,
                            const std::string& data) {
  char* buf = io_.get();
  const char* spaces = buf + kIoBytes;
  size_t used = 0;  // bytes of `data` placed so far
  for (off_t off = at; off < upto;) {
    const size_t len = static_cast<size_t>(std::min<off_t>(upto - off, kIoBytes));
    const size_t take = std::min(data.size() - used, len);
    const bool has_bracket = bracket >= off && bracket < off + static_cast<off_t>(len);
    const char* from = spaces;  // padding only: written straight from the spaces
    if (take > 0 || has_bracket) {
      std::memcpy(buf, data.data() + used, take);
      std::memset(buf + take, ' ', len - take);
      if (has_bracket) buf[bracket - off] = ']';
      from = buf;
    }
    if (!WriteAll(fd, off, from, len)) return false;
    used += take;
    off += static_cast<off_t>(len);
  }
  return true;
}

bool TimelineFile::CopyPages(int from, int to, off_t n) {
  for (off_t off = 0; off < n;) {
    const size_t len = static_cast<size_t>(std::min<off_t>(n - off, kIoBytes));
    if (!ReadAll(from, off, io_.get(), len) || !WriteAll(to, off, io_.get(), len)) return false;
    off += static_cast<off_t>(len);
  }
  return true;
}

bool TimelineFile::Flush(const std::string& text, off_t at) {
  if (at == pos_) return true;
  const off_t base = PageStart(pos_);
  if (!PutPages(fd_, base, PageEnd(at), end_, text)) {
    Fail("write failed");
    return false;
  }
  pos_ = at;
  head_.assign(text, static_cast<size_t>(PageStart(at) - base), std::string::npos);
  return true;
}

bool TimelineFile::Rewrite(off_t new_end, const char* tail) {
  // Whole pages up to the one holding pos_, then that page's content (head_) and `tail`, spaces
  // and the bracket; a trimmed file (new_end not at a page's end) is cut right after its bracket.
  const off_t base = PageStart(pos_), size = new_end + 1;
  const int fd = ReplaceFile(path_, [&](int to) {
    return CopyPages(fd_, to, base) && PutPages(to, base, PageEnd(size), new_end, head_ + tail) &&
           (size == PageEnd(size) || ::ftruncate(to, size) == 0);
  });
  if (fd < 0) {
    Fail("cannot rewrite the file");
    return false;
  }
  ::close(fd_);
  fd_ = fd;
  end_ = new_end;
  return true;
}

bool TimelineFile::Place(std::string_view event) {
  const off_t size = static_cast<off_t>(event.size());
  if (event.size() > page_) return true;  // cannot happen with names cut to kMaxNameChars
  const auto start_for = [&](off_t from) {  // an event that would cross moves to the next page
    return from % static_cast<off_t>(page_) + size > static_cast<off_t>(page_) ? PageEnd(from)
                                                                                : from;
  };
  off_t start = start_for(at_);
  if (start + size > end_) {  // region full: write what fits, then grow (the content stops at
    // at_: the padding is left out, it would cover the bracket)
    const off_t grown = PageEnd(std::max<off_t>(kGrowth * (end_ + 1), size + 1 + PageEnd(at_)));
    if (!Flush(text_, at_) || !Rewrite(grown - 1)) return false;
    text_ = head_;  // pos_ == at_ now
    start = start_for(at_);
  }
  if (start > at_) text_.append(static_cast<size_t>(start - at_), ' ');
  text_ += event;
  at_ = start + size;
  wrote_any_ = true;
  return true;
}

}  // namespace hvdl
