#include "torch/accumulator_hook.h"

#include <algorithm>
#include <utility>

#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/function_hook.h>

namespace hvdl {
namespace {

using torch::autograd::variable_list;

// Owned by the node (its hook vector) for the node's life; holds the subscribers.
class AccumulatorHook : public torch::autograd::FunctionPostHook {
 public:
  explicit AccumulatorHook(std::shared_ptr<AccumulatorSubscribers> subscribers)
      : subscribers_(std::move(subscribers)) {}
  variable_list operator()(const variable_list& outputs, const variable_list& /*inputs*/) override {
    subscribers_->Notify();
    return outputs;
  }
  const std::shared_ptr<AccumulatorSubscribers>& subscribers() const { return subscribers_; }

 private:
  std::shared_ptr<AccumulatorSubscribers> subscribers_;
};

}  // namespace

std::shared_ptr<AccumulatorSubscribers> AccumulatorSubscribers::Find(
    const torch::autograd::Node& node) {
  // Reading the vector while the engine iterates it is safe; only writes are not.
  for (const auto& hook : node.post_hooks()) {
    if (auto* ours = dynamic_cast<AccumulatorHook*>(hook.get())) return ours->subscribers();
  }
  return nullptr;
}

std::shared_ptr<AccumulatorSubscribers> AccumulatorSubscribers::Of(torch::autograd::Node& node) {
  if (auto found = Find(node)) return found;
  auto subscribers = std::make_shared<AccumulatorSubscribers>();
  node.add_post_hook(std::make_unique<AccumulatorHook>(subscribers));
  return subscribers;
}

void AccumulatorSubscribers::Subscribe(const void* key, std::weak_ptr<GradReadyListener> listener,
                                       int index) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.push_back(Entry{key, std::move(listener), index});
}

void AccumulatorSubscribers::Unsubscribe(const void* key, int index) {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return e.key == key && e.index == index; }),
                 entries_.end());
}

size_t AccumulatorSubscribers::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void AccumulatorSubscribers::Notify() const {
  // Copied first: a listener may take the GIL (while a Python thread holding it subscribes),
  // unsubscribe, or be destroyed when its last owner - possibly `alive` below - lets go.
  c10::SmallVector<Entry, 2> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.assign(entries_.begin(), entries_.end());
  }
  for (const Entry& e : entries) {
    if (auto alive = e.listener.lock()) alive->OnGradReady(e.index);
  }
}

}  // namespace hvdl
