// Request / Response: what ranks tell the coordinator and what the coordinator tells every rank.
//
// A Request describes one named tensor submitted on one rank. The coordinator (rank 0) merges the
// Requests of every member rank under one name, validates them and emits one Response per name. All
// ranks receive the same ordered ResponseList and execute it in that order, which is what keeps the
// collectives matched across ranks. Serialisation is a compact little-endian byte stream; the reader
// checks bounds so a corrupt message becomes a Status, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "common/types.h"

namespace hvdl {

// Names are scoped by process set (as in Horovod, where each set negotiates on its own): the same
// name may be pending in two sets at once. Every table keys on this, never on the bare name.
std::string TensorKey(const std::string& name, int32_t process_set);

struct Request {
  OpType op = OpType::kAllreduce;
  std::string name;
  int32_t rank = 0;  // sender, global rank
  DataType dtype = DataType::kFloat32;
  Shape shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;  // broadcast: global rank of the root
  int32_t device = kCpuDevice;
  int32_t process_set = 0;
  std::vector<int64_t> splits;  // alltoall: rows sent to each member (set-relative order)
  std::string site;             // user call site "file.py:123", for stall reports

  // True when two requests for the same name would produce the same collective on this rank
  // (everything but sender and call site). Used by the response cache.
  bool SameSignature(const Request& other) const;
  std::string Key() const { return TensorKey(name, process_set); }
};

struct Response {
  OpType op = OpType::kAllreduce;
  std::string name;
  std::string error;  // non-empty: the collective failed on every rank with this message
  StatusCode error_code = StatusCode::kOk;
  DataType dtype = DataType::kFloat32;
  Shape shape;  // allreduce/broadcast/reducescatter: the full shape; allgather/alltoall: trailing dims
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  int32_t device = kCpuDevice;
  int32_t process_set = 0;
  // allgather: first dimension of every member; alltoall: members x members matrix of rows that
  // member i sends to member j (row-major); join: [last rank to join].
  std::vector<int64_t> sizes;

  bool is_error() const { return !error.empty(); }
  std::string Key() const { return TensorKey(name, process_set); }
};

// One pending request as a rank reports it to the stall inspector.
struct PendingInfo {
  std::string name;
  OpType op = OpType::kAllreduce;
  int32_t process_set = 0;
  std::string site;
  double age_seconds = 0;
};

// What one rank sends to the coordinator in a slow-path cycle.
struct RankMessage {
  std::vector<Request> requests;
  bool has_report = false;           // set in stall-check cycles
  std::vector<PendingInfo> pending;  // everything this rank waits for
  PendingInfo last;                  // this rank's most recent submission (name empty if none)
};

// Tunable parameters the coordinator hands to every rank (autotune), applied by all ranks at the
// same cycle, before that cycle's responses run.
struct TunedParams {
  bool present = false;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  bool converged = false;  // autotune is done: these are the final parameters
};

struct ResponseList {
  std::vector<Response> responses;
  bool shutdown = false;
  std::string shutdown_reason;
  TunedParams params;
};

class ByteWriter {
 public:
  void I32(int32_t v) { Raw(&v, sizeof(v)); }
  void I64(int64_t v) { Raw(&v, sizeof(v)); }
  void F64(double v) { Raw(&v, sizeof(v)); }
  void Str(const std::string& s);
  void I64s(const std::vector<int64_t>& v);
  std::string Take() { return std::move(out_); }

 private:
  void Raw(const void* p, size_t n) { out_.append(static_cast<const char*>(p), n); }
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& in) : in_(in) {}
  bool I32(int32_t* v) { return Raw(v, sizeof(*v)); }
  bool I64(int64_t* v) { return Raw(v, sizeof(*v)); }
  bool F64(double* v) { return Raw(v, sizeof(*v)); }
  bool Str(std::string* s);
  bool I64s(std::vector<int64_t>* v);
  bool done() const { return pos_ == in_.size(); }

 private:
  bool Raw(void* p, size_t n);
  const std::string& in_;
  size_t pos_ = 0;
};

std::string SerializeRequests(const std::vector<Request>& requests);
Status ParseRequests(const std::string& bytes, std::vector<Request>* out);
std::string SerializeRankMessage(const RankMessage& message);
Status ParseRankMessage(const std::string& bytes, RankMessage* out);
std::string SerializeResponses(const ResponseList& list);
Status ParseResponses(const std::string& bytes, ResponseList* out);

}  // namespace hvdl
