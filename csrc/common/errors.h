// The exceptions of the binding boundary (STYLE rule 6: Status inside the core, exceptions only
// where Python calls in). The Python module registers them as Python classes:
// kInvalidArgument -> HorovodArgumentError (a ValueError and a RuntimeError: Horovod code catches
// either), everything else -> HorovodInternalError. Plain C++: no Python header needed.
#pragma once

#include <stdexcept>

#include "common/status.h"

namespace hvdl {

class InternalError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A bad argument, found before anything was enqueued (Python: HorovodArgumentError).
class ArgumentError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Throws the exception for a non-ok status; nothing for ok.
inline void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  if (status.code() == StatusCode::kInvalidArgument) throw ArgumentError(status.message());
  throw InternalError(status.message());
}

}  // namespace hvdl
