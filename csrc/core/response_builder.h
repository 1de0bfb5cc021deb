// BuildResponse: the coordinator's validation of one complete name.
//
// Given the requests every member rank submitted under one name, either produce the Response that
// all ranks will execute, or an error Response whose message names the operation, the tensor, each
// rank's value and a hint, e.g.
//   allreduce 'grad.w': shape mismatch: rank 0 float32[4,4], rank 2 float32[4,5]; every rank must
//   submit the same shape under one name.
// The function is pure (no communication) so it is unit-tested directly.
#pragma once

#include <string>
#include <vector>

#include "core/message.h"

namespace hvdl {

// `requests[i]` is the request of member i (set-relative order) or nullptr if member i has joined
// (hvd.join) and contributes zeros. At least one entry is non-null.
Response BuildResponse(const std::vector<const Request*>& requests, const std::vector<int>& members);

}  // namespace hvdl
