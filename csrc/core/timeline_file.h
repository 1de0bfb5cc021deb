// The timeline's file: a JSON array of trace events that is valid at every moment, also when the
// job is SIGKILLed in the middle of a write (Linux stops a write between page-cache folios, so a
// killed write leaves a prefix that ends on a page boundary). The layout makes every such prefix
// valid:
//   "[" events, padding spaces ... "]"
// The closing bracket sits at the end of a preallocated region of spaces, and events are written
// into the spaces without ever crossing a page boundary (an event that would is moved to the next
// page; the gap stays spaces). So every page of a partial write holds whole events and
// whitespace, and the bracket is already in place behind them. When the region is full, a copy
// with a region four times the size replaces the file with rename() (atomic); Finish() trims the
// padding the same way. Files of a killed job may end in up to 3/4 of their size of spaces.
//
// Only whole pages are written, from a page-aligned buffer, so the file is opened O_DIRECT where
// the filesystem allows it (else buffered, same code). Measured on a VM, most of the timeline's
// cost was not CPU but page-cache churn: every new page of the file is a fresh page of memory,
// and the pages of each replaced copy are freed again (on a VM that returns freed memory to its
// host, each such page costs a host fault). Direct I/O bypasses the page cache; Linux completes a
// direct write's submitted blocks even when the writer is killed, so the page-boundary argument
// above holds for it too (block size <= page size).
//
// One thread at a time (the timeline's writer thread, or Timeline::Start/Stop while no writer
// runs). An I/O error logs once and closes the file (is_open() turns false); what was written
// before stays.
#pragma once

#include <sys/types.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace hvdl {

class TimelineFile {
 public:
  TimelineFile() = default;
  ~TimelineFile() { Close(); }
  TimelineFile(const TimelineFile&) = delete;
  TimelineFile& operator=(const TimelineFile&) = delete;

  // Replaces whatever is at `path`, in one rename, by "[", the first region of spaces and "]".
  Status Open(const std::string& path);
  bool is_open() const { return fd_ >= 0; }
  // An event was placed since Open() (the next one starts with a separator).
  bool wrote_any() const { return wrote_any_; }
  // A round places events into memory and writes the pages they touched at its end.
  void BeginRound();
  // Appends `event` (at most a page) without letting it cross a page boundary; grows the file
  // first when the region is full. False after an I/O error.
  bool Place(std::string_view event);
  void EndRound();
  // Drops the padding: a copy ending "\n]" replaces the file.
  void Finish();
  void Close();

 private:
  off_t PageStart(off_t at) const;
  off_t PageEnd(off_t at) const;  // the first page boundary at or after `at`
  // Writes [at, upto) (page-aligned) as `data`, then spaces, with the closing bracket at
  // `bracket` if that falls inside.
  bool PutPages(int fd, off_t at, off_t upto, off_t bracket, const std::string& data);
  // Copies [0, n) from one file to another.
  bool CopyPages(int from, int to, off_t n);
  // `text` is the content of [PageStart(pos_), at): write it, advancing pos_ to `at`; false
  // (and the file closed) on an I/O error.
  bool Flush(const std::string& text, off_t at);
  // Replace the file, via rename(), by a copy of its events [0, pos_) and `tail` followed by
  // spaces up to `new_end` and the closing bracket there (Finish trims the padding with
  // new_end = pos_ + 1 and tail "\n").
  bool Rewrite(off_t new_end, const char* tail = "");
  void Fail(const char* what);

  std::string path_;
  int fd_ = -1;
  off_t pos_ = 0;     // end of the last event written: [0, pos_) is final content
  off_t end_ = 0;     // offset of the closing ']' (the file is end_ + 1 bytes)
  std::string head_;  // the content of the page holding pos_: [PageStart(pos_), pos_)
  // What the pages from the one holding pos_ onwards will hold in this round (it starts with
  // head_), and where its next byte lands. Members: their memory is reused.
  std::string text_;
  off_t at_ = 0;
  struct FreeDeleter {
    void operator()(char* p) const { std::free(p); }
  };
  // Page-aligned: the data half, and a half of spaces the padding is written from.
  std::unique_ptr<char, FreeDeleter> io_;
  size_t page_ = 4096;
  bool wrote_any_ = false;
};

}  // namespace hvdl
