// StallInspector: turns "some ranks wait for a collective that others never submitted" into a
// report naming the tensors, the ranks that submitted and the ranks that did not, with the user
// call sites (file:line) of the submissions and of the missing ranks' last submissions.
//
// Protocol. A rank whose oldest pending request is older than HOROVOD_STALL_CHECK_TIME_SECONDS
// sets the stall bit in the cycle's bit vector (at most once per check period). Every rank then
// attaches a report of everything it waits for to that cycle's gather - cached names included,
// which the coordinator otherwise never sees per rank - and the coordinator runs Inspect. With
// HOROVOD_STALL_SHUTDOWN_TIME_SECONDS set, a stall older than that shuts the job down on every
// rank with the report as the reason, so every rank raises instead of hanging.
#pragma once

#include <string>
#include <vector>

#include "core/message.h"
#include "core/process_set.h"

namespace hvdl {

struct StallVerdict {
  std::string report;     // empty: nothing stalled
  bool shutdown = false;  // a stall exceeded the shutdown time
};

class StallInspector {
 public:
  StallInspector(double warn_seconds, double shutdown_seconds)
      : warn_seconds_(warn_seconds), shutdown_seconds_(shutdown_seconds) {}

  // `messages[r]` is rank r's message of a stall-check cycle (all have has_report set).
  StallVerdict Inspect(const std::vector<RankMessage>& messages,
                       const ProcessSetTable& sets) const;

 private:
  double warn_seconds_;
  double shutdown_seconds_;
};

}  // namespace hvdl
