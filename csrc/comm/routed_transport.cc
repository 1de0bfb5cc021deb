#include "comm/routed_transport.h"

#include <algorithm>
#include <chrono>
#include <thread>

namespace hvdl {

RoutedTransport::RoutedTransport(std::vector<std::unique_ptr<Transport>> parts,
                                 std::vector<Route> routes, int rank)
    : parts_(std::move(parts)), routes_(std::move(routes)), rank_(rank) {}

int RoutedTransport::Remember(int part, int inner) {
  if (!free_.empty()) {
    const int id = free_.back();
    free_.pop_back();
    requests_[static_cast<size_t>(id)] = {part, inner};
    return id;
  }
  requests_.emplace_back(part, inner);
  return static_cast<int>(requests_.size() - 1);
}

Status RoutedTransport::PostSend(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                 int* request) {
  const Route& r = routes_[static_cast<size_t>(peer)];
  int inner;
  HVDL_RETURN_IF_ERROR(parts_[static_cast<size_t>(r.part)]->PostSend(spans, esize, r.peer, tag,
                                                                     &inner));
  *request = Remember(r.part, inner);
  return Status::Ok();
}

Status RoutedTransport::PostRecv(const std::vector<Span>& spans, size_t esize, int peer, int tag,
                                 int* request) {
  const Route& r = routes_[static_cast<size_t>(peer)];
  int inner;
  HVDL_RETURN_IF_ERROR(parts_[static_cast<size_t>(r.part)]->PostRecv(spans, esize, r.peer, tag,
                                                                     &inner));
  *request = Remember(r.part, inner);
  return Status::Ok();
}

std::pair<Transport*, int> RoutedTransport::Take(int request) {
  const auto [part, inner] = requests_[static_cast<size_t>(request)];
  free_.push_back(request);
  Transport* waited = parts_[static_cast<size_t>(part)].get();
  if (parts_.size() > 1 && !waited->Ready(inner)) {
    // Yield the core first (the peers that drain us may need it), then short sleeps: a long
    // Gloo transfer costs little while a message to a local peer still streams.
    const auto start = std::chrono::steady_clock::now();
    auto sleep = std::chrono::microseconds(8);
    while (!waited->Ready(inner)) {
      bool pending = false;
      for (size_t p = 0; p < parts_.size(); ++p) {
        if (static_cast<int>(p) != part) pending |= parts_[p]->Progress();
      }
      if (!pending) break;
      if (std::chrono::steady_clock::now() - start < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(64));
      }
    }
  }
  return {waited, inner};
}

Status RoutedTransport::Wait(int request) {
  const auto [waited, inner] = Take(request);
  return waited->Wait(inner);
}

Status RoutedTransport::WaitUntil(int request, std::chrono::steady_clock::time_point deadline) {
  const auto [waited, inner] = Take(request);
  return waited->WaitUntil(inner, deadline);
}

bool RoutedTransport::Progress() {
  bool pending = false;
  for (auto& p : parts_) pending |= p->Progress();
  return pending;
}

bool RoutedTransport::Ready(int request) {
  const auto [part, inner] = requests_[static_cast<size_t>(request)];
  return parts_[static_cast<size_t>(part)]->Ready(inner);
}

int RoutedTransport::single_copy_peers() const {
  int n = 0;
  for (const auto& p : parts_) n += p->single_copy_peers();
  return n;
}

}  // namespace hvdl
