// AccumulatorHook: our one post hook on a parameter's AccumulateGrad node, shared by every
// GradReducer that reduces the parameter (grad_reducer.h).
//
// Why one hook per node, installed once and never removed: torch's engine runs a node's post
// hooks by iterating the node's hook vector, on autograd's threads, without a lock. Erasing a
// hook from that vector (or appending one, which may reallocate it) while the engine iterates it
// skips a hook or calls a destroyed one. That happens when a reducer is destroyed inside its own
// hook (its hook held the last reference while the user's call site, or another thread, dropped
// the optimizer), or when one thread wraps or drops an optimizer while another runs backward. So
// the node's hook vector is written once per node, by `SubscribersOf` when no hook of ours is on
// it yet (as torch's own register_hook writes it), and never again. Reducers come and go as
// subscribers: a list with its own mutex, which the hook copies before calling anyone, so a
// subscriber may (un)subscribe - or be destroyed - while the hook runs. A subscriber is held
// weakly and must check, when called, that it still wants the call (it may have unsubscribed
// after the copy).
//
// Threads: the hook runs on autograd's threads. `SubscribersOf` is called with the GIL held (the
// bindings' calls), which keeps two installers off one node.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include <torch/csrc/autograd/function.h>

namespace hvdl {

// What a subscriber is told: parameter `index` (its own numbering) has accumulated a gradient.
class GradReadyListener {
 public:
  virtual ~GradReadyListener() = default;
  virtual void OnGradReady(int index) = 0;
};

class AccumulatorSubscribers {
 public:
  // The subscribers of `node` (an AccumulateGrad); adds our hook to the node the first time.
  static std::shared_ptr<AccumulatorSubscribers> Of(torch::autograd::Node& node);
  // The subscribers of `node` if our hook is on it, else nullptr; adds nothing.
  static std::shared_ptr<AccumulatorSubscribers> Find(const torch::autograd::Node& node);

  // `key` identifies the subscriber for Unsubscribe (the listener's address).
  void Subscribe(const void* key, std::weak_ptr<GradReadyListener> listener, int index);
  void Unsubscribe(const void* key, int index);
  size_t size() const;

  // The hook: calls every subscriber alive, outside the lock.
  void Notify() const;

 private:
  struct Entry {
    const void* key;
    std::weak_ptr<GradReadyListener> listener;
    int index;
  };
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace hvdl
