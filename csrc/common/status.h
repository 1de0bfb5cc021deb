// Status: the only error currency inside the core.
//
// The background thread never throws. Every fallible core function returns a Status; the binding
// layer turns a non-ok Status into a Python exception in the caller's thread:
//   kInvalidArgument -> ValueError            (user mistake detected on this rank)
//   kMismatch        -> HorovodInternalError  (ranks disagree; message names each rank's value)
//   kAborted         -> HorovodInternalError  (shut down before completion)
//   kStalled         -> HorovodInternalError  (stall shutdown time exceeded)
//   kInternal        -> HorovodInternalError  (MPI/transport failure)
//   kPeerFailed      -> HorovodInternalError  (ranks of the job failed; MPI with ULFM reported
//                                              it and the survivors can shrink and go on)
#pragma once

#include <string>
#include <utility>

namespace hvdl {

enum class StatusCode { kOk = 0, kInvalidArgument, kMismatch, kAborted, kStalled, kInternal,
                        kPeerFailed };

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Mismatch(std::string m) { return {StatusCode::kMismatch, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Stalled(std::string m) { return {StatusCode::kStalled, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status PeerFailed(std::string m) { return {StatusCode::kPeerFailed, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

}  // namespace hvdl

// Propagates a non-ok Status to the caller.
#define HVDL_RETURN_IF_ERROR(expr)          \
  do {                                      \
    ::hvdl::Status _hvdl_status = (expr);   \
    if (!_hvdl_status.ok()) return _hvdl_status; \
  } while (0)
