#include "comm/routed_transport.h"

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

Status RoutedTransport::Wait(int request) {
  const auto [part, inner] = requests_[static_cast<size_t>(request)];
  free_.push_back(request);
  return parts_[static_cast<size_t>(part)]->Wait(inner);
}

int RoutedTransport::single_copy_peers() const {
  int n = 0;
  for (const auto& p : parts_) n += p->single_copy_peers();
  return n;
}

}  // namespace hvdl
