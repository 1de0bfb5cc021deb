#include "python/runtime.h"

namespace hvdl {

Runtime& Runtime::Get() {
  // Leaked on purpose: handles and the context must stay valid during interpreter teardown.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

Context& Runtime::RequireContext() {
  if (!context_) {
    throw ArgumentError(
        "Horovod has not been initialized; use hvd.init() before calling collectives or "
        "rank/size queries.");
  }
  return *context_;
}

void Runtime::retire_aborted(std::unique_ptr<Context> ctx) {
  if (!ctx->restartable_after_loss()) ranks_lost_ = true;
  ctx.release();  // leaked on purpose
}

}  // namespace hvdl
