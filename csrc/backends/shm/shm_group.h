// ShmGroup: one POSIX shared-memory segment shared by the `size` member processes of one host.
// The shared-memory transport and control plane (shm_transport, shm_control_plane) live in it.
//
// Attach protocol (ShmGroup::Attach, collective over the members):
//   1. member 0 creates the segment (shm_open O_CREAT|O_EXCL; a leftover of a crashed earlier
//      run of the same name is removed first), sizes it (ftruncate, then posix_fallocate so a
//      full /dev/shm fails here with a Status instead of SIGBUS at first touch), maps it,
//      writes the layout parameters and its pid, then stores the ready magic with release
//      semantics;
//   2. the others open and map it, retrying until `timeout` (while it does not exist, is not
//      ready yet, or was left by a dead creator), and check that its layout is the one they
//      expect;
//   3. every member records its pid and process start time and marks itself attached;
//   4. everyone waits until all members attached (bounded by the same timeout; the error names
//      the members that never did); then member 0 shm_unlink()s the name, so nothing is left in
//      /dev/shm even if processes crash later (the memory lives until the last unmap). Any
//      member that fails after finding the segment unlinks it too.
//
// Layout (offsets fixed by size and options, so every member computes the same):
//   header (64 B) | member records (64 B each) | bitwise-OR area | rings
//   bitwise-OR area (control plane; absent when bitwise_or_words == 0), per member:
//     64 B {round started, words in round of parity 0, of parity 1} + 2 x W words;
//   rings: one ShmRing per ordered pair (src != dst) and tag, (src, dst, tag) in lexicographic
//     order - all pairs, or for a star only the pairs with member 0 (the control plane).
// Footprint, with R = pairs x tags (pairs = L (L - 1), a star 2 (L - 1)):
//   bytes = 64 + 64 L + L (64 + 16 W) + R (128 + K x 4160)
//   K (slots per ring) = the largest power of two <= 4 MiB / (R x 4160), clamped to [2, 16],
//   unless set. Data transport (4 tags, all pairs): L=2 521 KiB (K=16), L=4 3.1 MiB (K=16),
//   L=8 3.6 MiB (K=4), L=16 7.7 MiB (K=2); from L=16 on it grows as L^2 (32 MiB at L=32).
//   Control plane (ShmControlPlane::GroupOptions: a star, 2 tags, K=4; W=33): L=8 464 KiB,
//   L=64 4.1 MiB.
//
// Liveness: CheckPeers() reports members whose process is gone (no /proc entry or kill(pid, 0)
// says ESRCH, a zombie, or a different process start time: its pid was reused). A member whose
// process this one cannot observe (another pid namespace) is never reported.
//
// Threads: Attach blocks (main or background thread). Cancel and cancelled() are thread-safe;
// everything else is for the thread that uses the transports over the group.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/shm/shm_ring.h"
#include "common/status.h"

namespace hvdl {

struct ShmGroupOptions {
  int tags = 4;                 // rings per ordered pair (1 .. 4)
  bool star = false;            // rings only between member 0 and each other member
  uint32_t slots = 0;           // K per ring, a power of two; 0: by the formula above
  size_t bitwise_or_words = 0;  // W: most words one bitwise-OR round carries (0: no area)
  std::chrono::milliseconds timeout{30000};  // attach: for member 0 to create, for all to attach
  std::vector<std::string> names;            // display names ("rank 5"); default "member i"
};

class ShmGroup {
 public:
  // Blocking, collective over the `size` members (each calls it once with its `rank`, the same
  // `name` - a POSIX shm name, "/hvdl-<job>-<round>-<what>" - and the same layout options).
  // Errors: kInternal naming the segment and the system call, or which members never created
  // it / never attached within options.timeout, or a layout mismatch.
  static Status Attach(const std::string& name, int rank, int size,
                       const ShmGroupOptions& options, std::shared_ptr<ShmGroup>* out);
  // The segment's size in bytes for `size` members with `options` (the footprint formula), and
  // the slots per ring it gets. Pure computation.
  static size_t Footprint(int size, const ShmGroupOptions& options, uint32_t* slots = nullptr);
  ~ShmGroup();  // unmaps (the name is already unlinked)
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  int tags() const { return static_cast<int>(options_.tags); }
  uint32_t slots() const { return slots_; }
  size_t bytes() const { return bytes_; }
  size_t bitwise_or_words() const { return options_.bitwise_or_words; }

  // The ring carrying messages from `src` to `dst` on `tag`, or null when the layout has none
  // (a star between two non-zero members, a tag beyond tags()). The producer (src) and the
  // consumer (dst) each build their own handle on it.
  void* Ring(int src, int dst, int tag) const;

  // Bitwise-OR area of `member` (requires bitwise_or_words() > 0): its round counter (rounds
  // started; written by the member with release), the word count of the round of `parity`,
  // and the round's words.
  uint64_t* OrRound(int member) const;
  uint64_t* OrCount(int member, int parity) const;
  uint64_t* OrWords(int member, int parity) const;

  // "rank 5" (the display name) and "rank 5 (pid 1234)", for messages.
  std::string MemberName(int member) const;
  std::string MemberWithPid(int member) const;

  // Non-blocking: kPeerFailed naming every member (of `members`; default all others) whose
  // process is gone, else Ok. A wait checks only the members it waits for: one that finished
  // its part and exited is no failure.
  Status CheckPeers() const;
  Status CheckPeers(const std::vector<int>& members) const;
  // Scheduling hint for waits: NoteCpu records the CPU this member runs on (cheap; a store
  // only when it changed); SharesCpuWith says whether `member` last noted the same CPU, i.e. it
  // cannot run while this member spins on that CPU.
  void NoteCpu();
  bool SharesCpuWith(int member) const;
  // Any thread: every current and later wait on this group's member object (transport,
  // control plane) returns kAborted with `reason`. The first reason sticks.
  void Cancel(const std::string& reason);
  // kAborted with the reason once cancelled, else Ok. Any thread.
  Status cancelled() const;
  bool is_cancelled() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  ShmGroup(std::string name, int rank, int size, const ShmGroupOptions& options);
  Status Create();
  Status Open(std::chrono::steady_clock::time_point deadline);
  Status Register(std::chrono::steady_clock::time_point deadline);
  Status Fail(const std::string& what);  // unlinks, unmaps, returns kInternal naming the segment
  void ComputeLayout();

  std::string name_;
  int rank_;
  int size_;
  ShmGroupOptions options_;
  uint32_t slots_ = 0;
  size_t bytes_ = 0;
  size_t members_at_ = 0, or_at_ = 0, or_stride_ = 0, rings_at_ = 0, ring_stride_ = 0;
  char* base_ = nullptr;
  std::vector<int64_t> pids_;        // per member, once attached
  std::vector<uint64_t> starts_;     // per member: process start time (clock ticks since boot)
  std::vector<uint8_t> observable_;  // per member: this process can see its /proc entry
  int cpu_ = -1;                     // the CPU last noted
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::string cancel_reason_;
};

}  // namespace hvdl
