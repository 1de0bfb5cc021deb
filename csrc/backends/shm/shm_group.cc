#include "backends/shm/shm_group.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/logging.h"

namespace hvdl {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kReadyMagic = 0x68766c64'73686d31ULL;  // "hvldshm1"
constexpr uint64_t kVersion = 1;
constexpr size_t kLine = 64;
constexpr size_t kRingBudget = size_t{4} << 20;  // the formula's 4 MiB
constexpr uint32_t kMinSlots = 2, kMaxSlots = 16;

// The segment's first 64 bytes. Written by member 0 before `magic`, read-only afterwards.
struct Header {
  uint64_t magic;
  uint64_t version;
  uint64_t size;
  uint64_t params;  // tags | star << 8 | slots << 16
  uint64_t or_words;
  uint64_t bytes;
  uint64_t creator_pid;
  uint64_t creator_start;
};

struct MemberRecord {
  uint64_t pid;
  uint64_t start;
  uint64_t attached;  // 1 once the member mapped the segment (release)
  uint64_t cpu;       // 1 + the CPU the member last waited on (relaxed; a hint)
  char pad[32];
};

static_assert(sizeof(Header) == kLine && sizeof(MemberRecord) == kLine, "record layout");

std::string Errno(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// State and start time (clock ticks after boot) of process `pid` from /proc/<pid>/stat;
// false when there is no such entry.
bool ReadProcStat(int64_t pid, char* state, uint64_t* start) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return false;
  const size_t paren = line.rfind(')');  // the command name may hold spaces and ')'
  if (paren == std::string::npos) return false;
  std::istringstream rest(line.substr(paren + 1));
  std::string field;
  rest >> *state;
  for (int i = 4; i < 22 && rest >> field; ++i) {
  }
  return static_cast<bool>(rest >> *start);
}

uint64_t OwnStartTime() {
  char state;
  uint64_t start = 0;
  return ReadProcStat(getpid(), &state, &start) ? start : 0;
}

// Whether the process recorded as (pid, start) is gone, and how, as seen from this process.
// Empty when it is alive (or when nothing can be said).
std::string Gone(int64_t pid, uint64_t start) {
  char state = '?';
  uint64_t now_start = 0;
  if (ReadProcStat(pid, &state, &now_start)) {
    if (state == 'Z' || state == 'X') return "exited (zombie)";
    if (start != 0 && now_start != start) return "exited (its pid now belongs to another process)";
    return "";
  }
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return "exited";
  return "";
}

}  // namespace

ShmGroup::ShmGroup(std::string name, int rank, int size, const ShmGroupOptions& options)
    : name_(std::move(name)),
      rank_(rank),
      size_(size),
      options_(options),
      pids_(static_cast<size_t>(size), 0),
      starts_(static_cast<size_t>(size), 0),
      observable_(static_cast<size_t>(size), 0) {
  ComputeLayout();
}

ShmGroup::~ShmGroup() {
  if (base_ != nullptr) munmap(base_, bytes_);
}

size_t ShmGroup::Footprint(int size, const ShmGroupOptions& options, uint32_t* slots) {
  ShmGroup g("", 0, size, options);
  if (slots != nullptr) *slots = g.slots_;
  return g.bytes_;
}

// See the layout and the footprint formula in the header.
void ShmGroup::ComputeLayout() {
  const size_t l = static_cast<size_t>(size_);
  const size_t pairs = options_.star ? 2 * (l - 1) : l * (l - 1);
  const size_t rings = pairs * static_cast<size_t>(options_.tags);
  slots_ = options_.slots;
  if (slots_ == 0) {
    const size_t fit = rings == 0 ? kMaxSlots : kRingBudget / (rings * ShmRing::kSlotBytes);
    slots_ = kMinSlots;
    while (slots_ < kMaxSlots && size_t{slots_} * 2 <= fit) slots_ *= 2;
  }
  members_at_ = kLine;
  or_at_ = members_at_ + l * kLine;
  or_stride_ = options_.bitwise_or_words == 0
                   ? 0
                   : kLine + RoundUp(2 * options_.bitwise_or_words * sizeof(uint64_t), kLine);
  rings_at_ = or_at_ + l * or_stride_;
  ring_stride_ = ShmRing::Bytes(slots_);
  bytes_ = rings_at_ + rings * ring_stride_;
}

void* ShmGroup::Ring(int src, int dst, int tag) const {
  if (src == dst || tag < 0 || tag >= options_.tags || src < 0 || dst < 0 || src >= size_ ||
      dst >= size_) {
    return nullptr;
  }
  size_t pair;
  if (options_.star) {
    if (src != 0 && dst != 0) return nullptr;
    pair = src == 0 ? static_cast<size_t>(dst - 1) : static_cast<size_t>(size_ - 1 + src - 1);
  } else {
    pair = static_cast<size_t>(src) * static_cast<size_t>(size_ - 1) +
           static_cast<size_t>(dst < src ? dst : dst - 1);
  }
  const size_t index = pair * static_cast<size_t>(options_.tags) + static_cast<size_t>(tag);
  return base_ + rings_at_ + index * ring_stride_;
}

uint64_t* ShmGroup::OrRound(int member) const {
  return reinterpret_cast<uint64_t*>(base_ + or_at_ + static_cast<size_t>(member) * or_stride_);
}

uint64_t* ShmGroup::OrCount(int member, int parity) const {
  return OrRound(member) + 1 + parity;
}

uint64_t* ShmGroup::OrWords(int member, int parity) const {
  return OrRound(member) + kLine / sizeof(uint64_t) +
         static_cast<size_t>(parity) * options_.bitwise_or_words;
}

std::string ShmGroup::MemberName(int member) const {
  const size_t m = static_cast<size_t>(member);
  if (m < options_.names.size()) return options_.names[m];
  return "member " + std::to_string(member);
}

std::string ShmGroup::MemberWithPid(int member) const {
  return MemberName(member) + " (pid " + std::to_string(pids_[static_cast<size_t>(member)]) + ")";
}

Status ShmGroup::Fail(const std::string& what) {
  shm_unlink(name_.c_str());  // ENOENT when never created or already unlinked: fine
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  return Status::Internal("shared-memory group '" + name_ + "' (member " +
                          std::to_string(rank_) + " of " + std::to_string(size_) + "): " + what);
}

Status ShmGroup::Attach(const std::string& name, int rank, int size,
                        const ShmGroupOptions& options, std::shared_ptr<ShmGroup>* out) {
  if (size < 1 || rank < 0 || rank >= size || options.tags < 1 || options.tags > 4 ||
      (options.slots & (options.slots - 1)) != 0 || name.size() < 2 || name[0] != '/') {
    return Status::InvalidArgument("shared-memory group '" + name + "': member " +
                                   std::to_string(rank) + " of " + std::to_string(size) +
                                   ", " + std::to_string(options.tags) + " tags, " +
                                   std::to_string(options.slots) +
                                   " slots: expected 0 <= member < size, 1-4 tags, a power of "
                                   "two or 0 slots and a name '/...'");
  }
  std::shared_ptr<ShmGroup> g(new ShmGroup(name, rank, size, options));
  const auto deadline = Clock::now() + options.timeout;
  HVDL_RETURN_IF_ERROR(rank == 0 ? g->Create() : g->Open(deadline));
  HVDL_RETURN_IF_ERROR(g->Register(deadline));
  *out = std::move(g);
  return Status::Ok();
}

// Step 1 of the attach protocol (member 0).
Status ShmGroup::Create() {
  int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) {
    // Names are unique per job and round: one that exists was left by a run that crashed
    // before its members attached.
    HVDL_LOG(Warning) << "removing leftover shared-memory segment " << name_;
    shm_unlink(name_.c_str());
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  }
  if (fd < 0) return Fail(Errno("shm_open"));
  if (ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
    close(fd);
    return Fail(Errno("ftruncate"));
  }
  const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes_));
  if (rc != 0 && rc != EINVAL && rc != EOPNOTSUPP) {
    close(fd);
    return Fail("could not reserve " + std::to_string(bytes_) + " bytes (" +
                std::strerror(rc) + "); is /dev/shm full or too small (docker --shm-size)?");
  }
  void* at = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (at == MAP_FAILED) return Fail(Errno("mmap"));
  base_ = static_cast<char*>(at);
  auto* h = reinterpret_cast<Header*>(base_);  // the new file reads as zeros
  h->version = kVersion;
  h->size = static_cast<uint64_t>(size_);
  h->params = static_cast<uint64_t>(options_.tags) | (options_.star ? 1ULL << 8 : 0) |
              (static_cast<uint64_t>(slots_) << 16);
  h->or_words = options_.bitwise_or_words;
  h->bytes = bytes_;
  h->creator_pid = static_cast<uint64_t>(getpid());
  h->creator_start = OwnStartTime();
  ShmStoreRelease(&h->magic, kReadyMagic);
  return Status::Ok();
}

// Step 2 of the attach protocol (members other than 0).
Status ShmGroup::Open(Clock::time_point deadline) {
  auto pause = std::chrono::microseconds(200);
  std::string last = "it does not exist";
  while (true) {
    const int fd = shm_open(name_.c_str(), O_RDWR, 0600);
    if (fd < 0 && errno != ENOENT) return Fail(Errno("shm_open"));
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= sizeof(Header)) {
      void* at = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (at == MAP_FAILED) return Fail(Errno("mmap"));
      auto* h = static_cast<Header*>(at);
      const bool ready = ShmLoadAcquire(&h->magic) == kReadyMagic;
      if (ready && !Gone(static_cast<int64_t>(h->creator_pid), h->creator_start).empty()) {
        last = "only a leftover of a dead creator exists";  // member 0 will replace it
      } else if (ready) {
        const uint64_t params = static_cast<uint64_t>(options_.tags) |
                                (options_.star ? 1ULL << 8 : 0) |
                                (static_cast<uint64_t>(slots_) << 16);
        if (h->version != kVersion || h->size != static_cast<uint64_t>(size_) ||
            h->params != params || h->or_words != options_.bitwise_or_words ||
            h->bytes != bytes_ || static_cast<size_t>(st.st_size) < bytes_) {
          munmap(at, bytes_);
          return Fail("member 0 created it for " + std::to_string(h->size) +
                      " members (layout " + std::to_string(h->params) + ", " +
                      std::to_string(h->bytes) + " bytes); this member expects " +
                      std::to_string(size_) + " (layout " + std::to_string(params) + ", " +
                      std::to_string(bytes_) + " bytes): every member must pass the same "
                      "size and options");
        }
        base_ = static_cast<char*>(at);
        return Status::Ok();
      } else {
        last = "it is not initialised yet";
      }
      munmap(at, bytes_);
    } else if (fd >= 0) {
      close(fd);
      last = "it is not sized yet";
    }
    if (Clock::now() >= deadline) {
      return Fail(MemberName(0) + " never created it within " +
                  std::to_string(options_.timeout.count()) + " ms (" + last + ")");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

// Steps 3 and 4 of the attach protocol (every member).
Status ShmGroup::Register(Clock::time_point deadline) {
  auto* records = reinterpret_cast<MemberRecord*>(base_ + members_at_);
  MemberRecord& me = records[rank_];
  me.pid = static_cast<uint64_t>(getpid());
  me.start = OwnStartTime();
  if (ShmExchange(&me.attached, 1) != 0) {
    return Fail("another process already attached as member " + std::to_string(rank_) +
                " (two processes with one local rank?)");
  }
  auto pause = std::chrono::microseconds(100);
  while (true) {
    std::vector<int> missing;
    for (int m = 0; m < size_; ++m) {
      if (ShmLoadAcquire(&records[m].attached) == 0) missing.push_back(m);
    }
    if (missing.empty()) break;
    if (Clock::now() >= deadline) {
      std::string names;
      for (int m : missing) names += (names.empty() ? "" : ", ") + MemberName(m);
      return Fail(names + " never attached within " + std::to_string(options_.timeout.count()) +
                  " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
  if (rank_ == 0 && shm_unlink(name_.c_str()) != 0) {
    HVDL_LOG(Warning) << "shm_unlink(" << name_ << "): " << std::strerror(errno);
  }
  // Who can be watched: a member whose /proc entry this process sees with the recorded start
  // time (in another pid namespace the pid means nothing here).
  for (int m = 0; m < size_; ++m) {
    const size_t i = static_cast<size_t>(m);
    pids_[i] = static_cast<int64_t>(records[m].pid);
    starts_[i] = records[m].start;
    char state;
    uint64_t start = 0;
    observable_[i] = ReadProcStat(pids_[i], &state, &start) && start == starts_[i];
  }
  return Status::Ok();
}

// The CPU is a scheduling hint only: relaxed accesses, written when it changes.
void ShmGroup::NoteCpu() {
  const int cpu = sched_getcpu();
  if (cpu < 0 || cpu == cpu_) return;
  cpu_ = cpu;
  auto* records = reinterpret_cast<MemberRecord*>(base_ + members_at_);
  __atomic_store_n(&records[rank_].cpu, static_cast<uint64_t>(cpu) + 1, __ATOMIC_RELAXED);
}

bool ShmGroup::SharesCpuWith(int member) const {
  if (cpu_ < 0 || member < 0 || member >= size_) return false;
  auto* records = reinterpret_cast<const MemberRecord*>(base_ + members_at_);
  return ShmLoadRelaxed(&records[member].cpu) == static_cast<uint64_t>(cpu_) + 1;
}

Status ShmGroup::CheckPeers() const {
  std::vector<int> all;
  for (int m = 0; m < size_; ++m) all.push_back(m);
  return CheckPeers(all);
}

Status ShmGroup::CheckPeers(const std::vector<int>& members) const {
  std::string dead;
  for (int m : members) {
    const size_t i = static_cast<size_t>(m);
    if (m == rank_ || m < 0 || m >= size_ || !observable_[i]) continue;
    const std::string how = Gone(pids_[i], starts_[i]);
    if (!how.empty()) dead += (dead.empty() ? "" : ", ") + MemberWithPid(m) + " " + how;
  }
  if (dead.empty()) return Status::Ok();
  return Status::PeerFailed("shared-memory group '" + name_ + "': " + dead);
}

void ShmGroup::Cancel(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_.load(std::memory_order_relaxed)) return;
  cancel_reason_ = reason;
  cancelled_.store(true, std::memory_order_release);
}

Status ShmGroup::cancelled() const {
  if (!is_cancelled()) return Status::Ok();
  std::lock_guard<std::mutex> lock(mu_);
  return Status::Aborted(cancel_reason_);
}

}  // namespace hvdl
