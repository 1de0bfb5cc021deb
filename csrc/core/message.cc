#include "core/message.h"

#include <cstring>

namespace hvdl {

std::string TensorKey(const std::string& name, int32_t process_set) {
  if (process_set == 0) return name;
  return name + '\x1f' + std::to_string(process_set);
}

bool Request::SameSignature(const Request& o) const {
  return op == o.op && name == o.name && dtype == o.dtype && shape == o.shape &&
         reduce_op == o.reduce_op && prescale == o.prescale && postscale == o.postscale &&
         root == o.root && device == o.device && process_set == o.process_set && splits == o.splits;
}

void ByteWriter::Str(const std::string& s) {
  I64(static_cast<int64_t>(s.size()));
  Raw(s.data(), s.size());
}

void ByteWriter::I64s(const std::vector<int64_t>& v) {
  I64(static_cast<int64_t>(v.size()));
  Raw(v.data(), v.size() * sizeof(int64_t));
}

bool ByteReader::Raw(void* p, size_t n) {
  if (in_.size() - pos_ < n) return false;
  if (n > 0) std::memcpy(p, in_.data() + pos_, n);  // an empty vector's data() may be null
  pos_ += n;
  return true;
}

bool ByteReader::Str(std::string* s) {
  int64_t n = 0;
  if (!I64(&n) || n < 0 || static_cast<size_t>(n) > in_.size() - pos_) return false;
  s->assign(in_.data() + pos_, static_cast<size_t>(n));
  pos_ += static_cast<size_t>(n);
  return true;
}

bool ByteReader::I64s(std::vector<int64_t>* v) {
  int64_t n = 0;
  if (!I64(&n) || n < 0 || static_cast<size_t>(n) > (in_.size() - pos_) / sizeof(int64_t)) {
    return false;
  }
  v->resize(static_cast<size_t>(n));
  return Raw(v->data(), v->size() * sizeof(int64_t));
}

namespace {

template <typename E>
bool ReadEnum(ByteReader& r, E* out) {
  int32_t v = 0;
  if (!r.I32(&v)) return false;
  *out = static_cast<E>(v);
  return true;
}

void WriteRequest(ByteWriter& w, const Request& q) {
  w.I32(static_cast<int32_t>(q.op));
  w.Str(q.name);
  w.I32(q.rank);
  w.I32(static_cast<int32_t>(q.dtype));
  w.I64s(q.shape);
  w.I32(static_cast<int32_t>(q.reduce_op));
  w.F64(q.prescale);
  w.F64(q.postscale);
  w.I32(q.root);
  w.I32(q.device);
  w.I32(q.process_set);
  w.I64s(q.splits);
  w.Str(q.site);
}

bool ReadRequest(ByteReader& r, Request* q) {
  return ReadEnum(r, &q->op) && r.Str(&q->name) && r.I32(&q->rank) && ReadEnum(r, &q->dtype) &&
         r.I64s(&q->shape) && ReadEnum(r, &q->reduce_op) && r.F64(&q->prescale) &&
         r.F64(&q->postscale) && r.I32(&q->root) && r.I32(&q->device) && r.I32(&q->process_set) &&
         r.I64s(&q->splits) && r.Str(&q->site);
}

void WriteResponse(ByteWriter& w, const Response& p) {
  w.I32(static_cast<int32_t>(p.op));
  w.Str(p.name);
  w.Str(p.error);
  w.I32(static_cast<int32_t>(p.error_code));
  w.I32(static_cast<int32_t>(p.dtype));
  w.I64s(p.shape);
  w.I32(static_cast<int32_t>(p.reduce_op));
  w.F64(p.prescale);
  w.F64(p.postscale);
  w.I32(p.root);
  w.I32(p.device);
  w.I32(p.process_set);
  w.I64s(p.sizes);
}

bool ReadResponse(ByteReader& r, Response* p) {
  return ReadEnum(r, &p->op) && r.Str(&p->name) && r.Str(&p->error) &&
         ReadEnum(r, &p->error_code) && ReadEnum(r, &p->dtype) && r.I64s(&p->shape) &&
         ReadEnum(r, &p->reduce_op) && r.F64(&p->prescale) && r.F64(&p->postscale) &&
         r.I32(&p->root) && r.I32(&p->device) && r.I32(&p->process_set) && r.I64s(&p->sizes);
}

void WritePending(ByteWriter& w, const PendingInfo& p) {
  w.Str(p.name);
  w.I32(static_cast<int32_t>(p.op));
  w.I32(p.process_set);
  w.Str(p.site);
  w.F64(p.age_seconds);
}

bool ReadPending(ByteReader& r, PendingInfo* p) {
  return r.Str(&p->name) && ReadEnum(r, &p->op) && r.I32(&p->process_set) && r.Str(&p->site) &&
         r.F64(&p->age_seconds);
}

}  // namespace

std::string SerializeRankMessage(const RankMessage& m) {
  ByteWriter w;
  w.Str(SerializeRequests(m.requests));
  w.I32(m.has_report ? 1 : 0);
  if (m.has_report) {
    w.I64(static_cast<int64_t>(m.pending.size()));
    for (const PendingInfo& p : m.pending) WritePending(w, p);
    WritePending(w, m.last);
  }
  return w.Take();
}

Status ParseRankMessage(const std::string& bytes, RankMessage* out) {
  ByteReader r(bytes);
  std::string requests;
  int32_t has_report = 0;
  if (!r.Str(&requests) || !r.I32(&has_report)) return Status::Internal("corrupt rank message");
  HVDL_RETURN_IF_ERROR(ParseRequests(requests, &out->requests));
  out->has_report = has_report != 0;
  out->pending.clear();
  if (out->has_report) {
    int64_t n = 0;
    if (!r.I64(&n) || n < 0) return Status::Internal("corrupt stall report");
    for (int64_t i = 0; i < n; ++i) {
      PendingInfo p;
      if (!ReadPending(r, &p)) return Status::Internal("corrupt stall report entry");
      out->pending.push_back(std::move(p));
    }
    if (!ReadPending(r, &out->last)) return Status::Internal("corrupt stall report tail");
  }
  if (!r.done()) return Status::Internal("trailing bytes after rank message");
  return Status::Ok();
}

std::string SerializeRequests(const std::vector<Request>& requests) {
  ByteWriter w;
  w.I64(static_cast<int64_t>(requests.size()));
  for (const Request& q : requests) WriteRequest(w, q);
  return w.Take();
}

Status ParseRequests(const std::string& bytes, std::vector<Request>* out) {
  ByteReader r(bytes);
  int64_t n = 0;
  if (!r.I64(&n) || n < 0) return Status::Internal("corrupt request list header");
  out->clear();
  for (int64_t i = 0; i < n; ++i) {
    Request q;
    if (!ReadRequest(r, &q)) return Status::Internal("corrupt request list entry");
    out->push_back(std::move(q));
  }
  if (!r.done()) return Status::Internal("trailing bytes after request list");
  return Status::Ok();
}

std::string SerializeResponses(const ResponseList& list) {
  ByteWriter w;
  w.I32(list.shutdown ? 1 : 0);
  w.Str(list.shutdown_reason);
  w.I32(list.params.present ? 1 : 0);
  w.I64(list.params.fusion_threshold_bytes);
  w.F64(list.params.cycle_time_ms);
  w.I32(static_cast<int32_t>(list.params.algorithm));
  w.I32(list.params.converged ? 1 : 0);
  w.I64(static_cast<int64_t>(list.responses.size()));
  for (const Response& p : list.responses) WriteResponse(w, p);
  return w.Take();
}

Status ParseResponses(const std::string& bytes, ResponseList* out) {
  ByteReader r(bytes);
  int32_t shutdown = 0, has_params = 0, converged = 0;
  int64_t n = 0;
  if (!r.I32(&shutdown) || !r.Str(&out->shutdown_reason) || !r.I32(&has_params) ||
      !r.I64(&out->params.fusion_threshold_bytes) || !r.F64(&out->params.cycle_time_ms) ||
      !ReadEnum(r, &out->params.algorithm) || !r.I32(&converged) || !r.I64(&n) || n < 0) {
    return Status::Internal("corrupt response list header");
  }
  out->shutdown = shutdown != 0;
  out->params.present = has_params != 0;
  out->params.converged = converged != 0;
  out->responses.clear();
  for (int64_t i = 0; i < n; ++i) {
    Response p;
    if (!ReadResponse(r, &p)) return Status::Internal("corrupt response list entry");
    out->responses.push_back(std::move(p));
  }
  if (!r.done()) return Status::Internal("trailing bytes after response list");
  return Status::Ok();
}

}  // namespace hvdl
