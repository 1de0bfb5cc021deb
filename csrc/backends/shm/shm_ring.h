// ShmRing: one side's handle on a single-producer / single-consumer ring of fixed-size slots in
// shared memory (backends/shm/shm_group lays the rings out; shm_transport moves messages
// through them).
//
// Protocol. The ring lives in shared memory as a 128-byte header - `tail` (fragments the
// producer has published) and `head` (fragments the consumer has released), each on a cache
// line of its own so the two sides never write one line - followed by K slots of kSlotBytes
// (K a power of two; fragment i lives in slot i mod K). Both counters only grow.
//   producer: a slot is free while tail - head < K; it writes the fragment into slot tail mod K,
//             then publishes it by storing tail + 1 with release semantics;
//   consumer: a fragment is there while head < tail (tail loaded with acquire semantics, so the
//             fragment's bytes are visible); it reads it, then releases the slot by storing
//             head + 1 with release semantics (so the producer overwrites it only afterwards).
// Each side keeps its own counter locally and re-reads the other side's only when its cached
// copy says the ring is full (producer) or empty (consumer): a busy stream costs one shared
// cache-line transfer per K fragments in the best case, not one per fragment.
// A slot holds one fragment: a 32-byte ShmFragment header, then up to kSlotPayload bytes.
//
// Invariants: exactly one thread produces into and one consumes from a ring (the transports of
// two members, each used by its own background thread); counters never wrap (2^64 fragments).
// The memory belongs to the ShmGroup, which must outlive the handle.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hvdl {

// Loads and stores of words that another process reads or writes concurrently. The segment is
// plain memory, so these use the compiler's atomic builtins on uint64_t rather than placing
// std::atomic objects in it (lock-free 8-byte atomics are address-free: they work across
// processes that map one page at different addresses).
inline uint64_t ShmLoadAcquire(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline uint64_t ShmLoadRelaxed(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void ShmStoreRelease(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline uint64_t ShmExchange(uint64_t* p, uint64_t v) {
  return __atomic_exchange_n(p, v, __ATOMIC_ACQ_REL);
}

// One fragment of a message: `total` bytes in the whole message, this fragment's `bytes` start
// at byte `offset` of it. The last fragment is the one with offset + bytes == total; an empty
// message is one fragment of 0 bytes.
struct ShmFragment {
  uint64_t total;
  uint64_t offset;
  uint32_t bytes;
  uint32_t reserved;
  uint64_t reserved2;
};

struct ShmRingHeader {
  alignas(64) uint64_t tail;
  char pad_tail[56];
  alignas(64) uint64_t head;
  char pad_head[56];
};

class ShmRing {
 public:
  // A single-copy descriptor (comm/single_copy_transport: 4120 bytes) fits one slot; 65 cache
  // lines, so consecutive slots start on cache-line boundaries.
  static constexpr size_t kSlotBytes = 4160;
  static constexpr size_t kSlotPayload = kSlotBytes - sizeof(ShmFragment);
  static constexpr size_t Bytes(uint32_t slots) {
    return sizeof(ShmRingHeader) + static_cast<size_t>(slots) * kSlotBytes;
  }

  ShmRing() = default;
  // `at`: the ring's first byte in the mapping; `slots`: K, a power of two.
  ShmRing(void* at, uint32_t slots)
      : header_(static_cast<ShmRingHeader*>(at)),
        slots_(static_cast<char*>(at) + sizeof(ShmRingHeader)),
        mask_(slots - 1),
        mine_(0),
        theirs_(0) {}
  bool valid() const { return header_ != nullptr; }

  // Producer: the next free slot, or null while the ring is full. Non-blocking.
  ShmFragment* FreeSlot() {
    if (mine_ - theirs_ > mask_) {
      theirs_ = ShmLoadAcquire(&header_->head);
      if (mine_ - theirs_ > mask_) return nullptr;
    }
    return Slot(mine_);
  }
  // Producer: publishes the slot FreeSlot returned.
  void Publish() { ShmStoreRelease(&header_->tail, ++mine_); }

  // Consumer: the oldest published fragment, or null while the ring is empty. Non-blocking.
  const ShmFragment* Arrived() {
    if (mine_ == theirs_) {
      theirs_ = ShmLoadAcquire(&header_->tail);
      if (mine_ == theirs_) return nullptr;
    }
    return Slot(mine_);
  }
  // Consumer: hands the slot Arrived returned back to the producer.
  void Release() { ShmStoreRelease(&header_->head, ++mine_); }

  // Payload bytes of a slot.
  static char* Payload(ShmFragment* f) { return reinterpret_cast<char*>(f + 1); }
  static const char* Payload(const ShmFragment* f) { return reinterpret_cast<const char*>(f + 1); }

 private:
  ShmFragment* Slot(uint64_t i) const {
    return reinterpret_cast<ShmFragment*>(slots_ + (i & mask_) * kSlotBytes);
  }

  ShmRingHeader* header_ = nullptr;
  char* slots_ = nullptr;
  uint64_t mask_ = 0;
  uint64_t mine_ = 0;    // producer: fragments published; consumer: fragments released
  uint64_t theirs_ = 0;  // the other side's counter, as last read
};

static_assert(sizeof(ShmFragment) == 32, "fragment header layout");
static_assert(sizeof(ShmRingHeader) == 128, "ring header layout");
static_assert(ShmRing::kSlotBytes % 64 == 0, "slots start on cache lines");
static_assert(__atomic_always_lock_free(sizeof(uint64_t), 0), "8-byte atomics are lock-free");

}  // namespace hvdl
