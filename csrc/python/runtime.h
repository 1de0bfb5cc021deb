// Runtime: what the Python module keeps for the life of the process: the current Context (if
// initialised) and the HandleTable it lends to each Context.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>

#include "common/errors.h"
#include "core/context.h"

namespace hvdl {

class Runtime {
 public:
  static Runtime& Get();
  // The running Context; throws ArgumentError("... use hvd.init().") if there is none.
  Context& RequireContext();
  Context* context() { return context_.get(); }
  HandleTable& handles() { return handles_; }
  std::mutex& lifecycle_mutex() { return lifecycle_mu_; }
  void set_context(std::unique_ptr<Context> ctx) { context_ = std::move(ctx); }
  std::unique_ptr<Context> take_context() { return std::move(context_); }
  // After a context that lost ranks of the job (Context::aborted): it is kept alive for ever
  // (the transport may still hold requests into its memory). Unless its transport can start
  // a world without them (Context::restartable_after_loss), the process neither starts
  // horovodlite again nor finalizes MPI (which still counts the lost ranks and would wait).
  void retire_aborted(std::unique_ptr<Context> ctx);
  // A context that recovered from failed ranks: kept alive (leaked); init works again.
  void retire_recovered(std::unique_ptr<Context> ctx) { ctx.release(); }
  bool ranks_lost() const { return ranks_lost_.load(); }

 private:
  Runtime() = default;
  std::mutex lifecycle_mu_;   // serialises init/shutdown
  HandleTable handles_;       // declared first: outlives every Context
  std::unique_ptr<Context> context_;
  std::atomic<bool> ranks_lost_{false};
};

}  // namespace hvdl
