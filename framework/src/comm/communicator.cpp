#include "shardplan/communicator.h"

#include <ATen/ATen.h>

#include <exception>

#include "comm/comm_trace.h"
#include "shardplan/error.h"

namespace shardplan {

namespace {

int32_t to_sp_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return SP_FLOAT32;
    case at::kDouble: return SP_FLOAT64;
    case at::kHalf: return SP_FLOAT16;
    case at::kBFloat16: return SP_BFLOAT16;
    case at::kChar: return SP_INT8;
    case at::kByte: return SP_UINT8;
    case at::kInt: return SP_INT32;
    case at::kLong: return SP_INT64;
    default:
      throw Error(std::string("shardplan: dtype ") + c10::toString(t) + " cannot be communicated");
  }
}

uint64_t bytes_of(const at::Tensor& t) { return static_cast<uint64_t>(t.numel()) * t.element_size(); }

// Records a synchronous call when it returns (a call that threw has no
// completion to show; its error says enough). Off, one branch each way.
class Traced {
 public:
  Traced(CommTrace* trace, const char* op, const std::string& group, const at::Tensor& t) : trace_(trace) {
    if (!trace_) return;
    // A barrier has no tensor: zero bytes.
    call_ = trace_->begin(op, group, false, t.defined() ? bytes_of(t) : 0,
                          to_sp_dtype(t.defined() ? t.scalar_type() : at::kByte));
    exceptions_ = std::uncaught_exceptions();
  }
  ~Traced() {
    if (trace_ && std::uncaught_exceptions() == exceptions_) trace_->record(call_, call_.t_issue, CommTrace::now_us());
  }
  Traced(const Traced&) = delete;
  Traced& operator=(const Traced&) = delete;

 private:
  CommTrace* trace_;
  TracedCall call_;
  int exceptions_ = 0;
};

std::vector<int64_t> with_dim(at::IntArrayRef shape, int64_t dim, int64_t value) {
  std::vector<int64_t> out(shape.begin(), shape.end());
  out[dim] = value;
  return out;
}

}  // namespace

// ---------------------------------------------------------------- Work

Work::Work(const sp_comm_api* api, sp_work* work, std::string what, std::vector<at::Tensor> keep,
           std::chrono::milliseconds timeout)
    : api_(api), work_(work), what_(std::move(what)), keep_(std::move(keep)), timeout_(timeout) {}

Work::~Work() {
  if (traced_) trace_->record_abandoned(*traced_);
  if (work_) api_->release(work_);
}

void Work::trace(std::shared_ptr<CommTrace> trace, std::unique_ptr<TracedCall> call) {
  trace_ = std::move(trace);
  traced_ = std::move(call);
}

void Work::traced_done(double t_wait_begin) {
  trace_->record(*traced_, t_wait_begin, CommTrace::now_us());
  traced_.reset();
}

void Work::wait() { wait(timeout_); }

void Work::wait(std::chrono::milliseconds timeout) {
  if (!work_) return;
  const double t_wait = traced_ ? CommTrace::now_us() : 0;
  int st = api_->wait(work_, timeout.count());
  if (st != SP_OK) {
    const char* why = api_->last_error();
    throw CommError(what_ + ": " + (why && *why ? why : "failed") +
                        (st == SP_ERR_TIMEOUT ? " (timed out after " + std::to_string(timeout.count()) + " ms)" : ""),
                    st);
  }
  api_->release(work_);
  work_ = nullptr;
  keep_.clear();
  if (traced_) traced_done(t_wait);
}

bool Work::done() {
  if (!work_) return true;
  int32_t d = 0;
  int st = api_->test(work_, &d);
  if (st != SP_OK) {
    const char* why = api_->last_error();
    throw CommError(what_ + ": " + (why && *why ? why : "failed"), st);
  }
  // Seen finished before anyone waited: the caller waited for none of it.
  if (d != 0 && traced_) traced_done(CommTrace::now_us());
  return d != 0;
}

// ---------------------------------------------------------------- Communicator

Communicator::Communicator(const sp_comm_api* api, sp_comm* comm, std::string name, std::vector<int> ranks,
                           std::chrono::milliseconds timeout)
    : api_(api), comm_(comm), name_(std::move(name)), ranks_(std::move(ranks)), timeout_(timeout) {
  rank_ = api_->rank(comm_);
  size_ = api_->size(comm_);
  if (ranks_.empty())
    for (int r = 0; r < size_; ++r) ranks_.push_back(r);
}

Communicator::~Communicator() {
  if (comm_) api_->destroy(comm_);
}

const std::string& Communicator::backend() const {
  static thread_local std::string name;
  name = api_->name;
  return name;
}

sp_buffer Communicator::buffer_of(const at::Tensor& t) {
  sp_buffer b{};
  b.data = t.numel() ? t.data_ptr() : nullptr;
  b.count = static_cast<uint64_t>(t.numel());
  b.dtype = to_sp_dtype(t.scalar_type());
  b.device_type = t.is_cuda() ? SP_DEVICE_CUDA : SP_DEVICE_CPU;
  b.device_index = t.is_cuda() ? t.device().index() : 0;
  b.stream = nullptr;
  return b;
}

void Communicator::check(int status, const char* collective) const {
  if (status == SP_OK) return;
  const char* why = api_->last_error();
  // A timeout almost always means a peer never called the collective (it
  // died, hangs, or took another code path); say so, and where the limit is set.
  const std::string hint = status == SP_ERR_TIMEOUT
                               ? " (a rank of group '" + name_ + "' did not join it, or it could not finish, within " +
                                     std::to_string(timeout_.count()) +
                                     " ms; the limit is SHARDPLAN_TIMEOUT_MS, or shardplan launch --timeout-ms)"
                               : "";
  throw CommError(std::string(api_->name) + " " + collective + " on group '" + name_ + "' (rank " +
                      std::to_string(rank_) + " of " + std::to_string(size_) + "): " +
                      (why && *why ? why : "failed with status " + std::to_string(status)) + hint,
                  status);
}

void Communicator::count(const at::Tensor& t) {
  // A group of one moves nothing; counting it would inflate a plan's volume.
  if (size_ == 1) return;
  stats_.calls += 1;
  stats_.bytes += bytes_of(t);
}

std::unique_ptr<TracedCall> Communicator::issue(const char* op, const at::Tensor& t) const {
  if (!trace_ || size_ == 1) return nullptr;
  return std::make_unique<TracedCall>(trace_->begin(op, name_, true, bytes_of(t), to_sp_dtype(t.scalar_type())));
}

std::unique_ptr<Work> Communicator::traced(std::unique_ptr<Work> w, std::unique_ptr<TracedCall> call) const {
  if (call && w) {
    call->t_issue_end = CommTrace::now_us();
    w->trace(trace_, std::move(call));
  }
  return w;
}

std::shared_ptr<Communicator> Communicator::split(int color, int key, const std::string& name) {
  sp_comm* out = nullptr;
  check(api_->split(comm_, color, key, &out), "split");
  if (!out) return nullptr;
  auto child = std::make_shared<Communicator>(api_, out, name, std::vector<int>{}, timeout_);
  // Members learn each other's world ranks once, so errors and reports can
  // name ranks as users know them.
  at::Tensor mine = at::full({1}, ranks_[rank_], at::kInt);
  at::Tensor all = child->all_gather(mine, 0);
  child->ranks_.assign(all.data_ptr<int32_t>(), all.data_ptr<int32_t>() + all.numel());
  child->reset_stats();
  child->set_trace(trace_);
  return child;
}

void Communicator::abort() { api_->abort(comm_); }

void Communicator::all_reduce(at::Tensor& t, ReduceOp op) {
  count(t);
  if (size_ == 1) return;
  const Traced traced(trace_.get(), "all_reduce", name_, t);
  at::Tensor c = t.contiguous();
  sp_buffer b = buffer_of(c);
  check(api_->all_reduce(comm_, &b, &b, static_cast<int32_t>(op), nullptr), "all_reduce");
  if (!c.is_same(t)) t.copy_(c);
}

at::Tensor Communicator::all_reduced(const at::Tensor& t, ReduceOp op) {
  count(t);
  // A group of one still returns a tensor of its own, as callers may write it.
  if (size_ == 1) return t.contiguous().clone();
  const Traced traced(trace_.get(), "all_reduce", name_, t);
  const at::Tensor in = t.contiguous();
  at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
  sp_buffer s = buffer_of(in), r = buffer_of(out);
  check(api_->all_reduce(comm_, &s, &r, static_cast<int32_t>(op), nullptr), "all_reduce");
  return out;
}

std::unique_ptr<Work> Communicator::all_reduce_async(at::Tensor& t, ReduceOp op) {
  if (!t.is_contiguous()) throw Error("all_reduce_async on group '" + name_ + "' needs a contiguous tensor");
  count(t);
  auto call = issue("all_reduce", t);
  sp_buffer b = buffer_of(t);
  sp_work* w = nullptr;
  check(api_->all_reduce(comm_, &b, &b, static_cast<int32_t>(op), &w), "all_reduce");
  return traced(std::make_unique<Work>(api_, w, std::string(api_->name) + " all_reduce on group '" + name_ + "'",
                                       std::vector<at::Tensor>{t}, timeout_),
                std::move(call));
}

at::Tensor Communicator::all_gather(const at::Tensor& t, int64_t dim) {
  dim = at::maybe_wrap_dim(dim, t.dim());
  count(t);
  if (size_ == 1) return t;
  const Traced traced(trace_.get(), "all_gather", name_, t);
  at::Tensor in = t.contiguous();
  std::vector<int64_t> shape{size_};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(shape, in.options());
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  check(api_->all_gather(comm_, &sb, &rb, nullptr), "all_gather");
  // [size, ..., d, ...] -> concatenation along dim, rank-major.
  auto result_shape = with_dim(in.sizes(), dim, in.size(dim) * size_);
  if (dim == 0) return out.view(result_shape);
  return out.movedim(0, dim).reshape(result_shape);
}

at::Tensor Communicator::reduce_scatter(const at::Tensor& t, int64_t dim, ReduceOp op) {
  dim = at::maybe_wrap_dim(dim, t.dim());
  if (t.size(dim) % size_ != 0)
    throw Error("reduce_scatter on group '" + name_ + "': dim " + std::to_string(dim) + " of size " +
                std::to_string(t.size(dim)) + " is not divisible by the group size " + std::to_string(size_));
  count(t);
  if (size_ == 1) return t;
  const Traced traced(trace_.get(), "reduce_scatter", name_, t);
  auto chunk = t.size(dim) / size_;
  // Bring the rank-major blocks to the front so each rank's block is contiguous.
  std::vector<int64_t> split_shape(t.sizes().begin(), t.sizes().end());
  split_shape[dim] = chunk;
  split_shape.insert(split_shape.begin() + dim, size_);
  at::Tensor in = dim == 0 ? t.contiguous() : t.reshape(split_shape).movedim(dim, 0).contiguous();
  auto out_shape = with_dim(t.sizes(), dim, chunk);
  at::Tensor out = at::empty(out_shape, t.options());
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  check(api_->reduce_scatter(comm_, &sb, &rb, static_cast<int32_t>(op), nullptr), "reduce_scatter");
  return out.view(out_shape);
}

std::unique_ptr<Work> Communicator::reduce_scatter_async(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  if (!in.is_contiguous() || !out.is_contiguous() || in.numel() != out.numel() * size_)
    throw Error("reduce_scatter_async on group '" + name_ + "' needs contiguous tensors of " +
                std::to_string(size_) + " x n and n elements");
  count(in);
  if (size_ == 1) {
    out.copy_(in);
    return nullptr;
  }
  auto call = issue("reduce_scatter", in);
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  sp_work* w = nullptr;
  check(api_->reduce_scatter(comm_, &sb, &rb, static_cast<int32_t>(op), &w), "reduce_scatter");
  return traced(std::make_unique<Work>(api_, w, std::string(api_->name) + " reduce_scatter on group '" + name_ + "'",
                                       std::vector<at::Tensor>{in, out}, timeout_),
                std::move(call));
}

std::unique_ptr<Work> Communicator::all_gather_async(const at::Tensor& in, at::Tensor& out) {
  if (!in.is_contiguous() || !out.is_contiguous() || out.numel() != in.numel() * size_)
    throw Error("all_gather_async on group '" + name_ + "' needs contiguous tensors of n and " +
                std::to_string(size_) + " x n elements");
  count(in);
  if (size_ == 1) {
    out.copy_(in);
    return nullptr;
  }
  auto call = issue("all_gather", in);
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  sp_work* w = nullptr;
  check(api_->all_gather(comm_, &sb, &rb, &w), "all_gather");
  return traced(std::make_unique<Work>(api_, w, std::string(api_->name) + " all_gather on group '" + name_ + "'",
                                       std::vector<at::Tensor>{in, out}, timeout_),
                std::move(call));
}

void Communicator::broadcast(at::Tensor& t, int root) {
  count(t);
  if (size_ == 1) return;
  const Traced traced(trace_.get(), "broadcast", name_, t);
  at::Tensor c = t.contiguous();
  sp_buffer b = buffer_of(c);
  check(api_->broadcast(comm_, &b, &b, root, nullptr), "broadcast");
  if (!c.is_same(t)) t.copy_(c);
}

at::Tensor Communicator::scatter(const at::Tensor& t, int root, const std::vector<int64_t>& chunk_shape) {
  at::Tensor out = at::empty(chunk_shape, t.defined() ? t.options() : at::TensorOptions());
  at::Tensor in = (rank_ == root) ? t.contiguous() : out;  // non-roots pass a dummy of the right dtype
  if (rank_ == root && in.numel() != out.numel() * size_)
    throw Error("scatter on group '" + name_ + "': root tensor has " + std::to_string(in.numel()) +
                " elements, expected " + std::to_string(out.numel() * size_));
  count(out);
  if (size_ == 1) return in.view(chunk_shape).clone();
  const Traced traced(trace_.get(), "scatter", name_, out);
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  if (rank_ != root) sb.count = out.numel() * size_;
  check(api_->scatter(comm_, &sb, &rb, root, nullptr), "scatter");
  return out;
}

at::Tensor Communicator::gather(const at::Tensor& t, int root) {
  at::Tensor in = t.contiguous();
  count(in);
  if (size_ == 1) return in.clone();
  const Traced traced(trace_.get(), "gather", name_, in);
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  if (shape.empty()) shape.push_back(1);
  shape[0] *= size_;
  at::Tensor out = rank_ == root ? at::empty(shape, in.options()) : at::empty({0}, in.options());
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  if (rank_ != root) rb.count = in.numel() * size_;
  check(api_->gather(comm_, &sb, &rb, root, nullptr), "gather");
  return rank_ == root ? out : at::Tensor();
}

at::Tensor Communicator::all_to_all(const at::Tensor& t) {
  if (t.dim() == 0 || t.size(0) % size_ != 0)
    throw Error("all_to_all on group '" + name_ + "': dim 0 must be divisible by the group size " +
                std::to_string(size_));
  at::Tensor in = t.contiguous();
  count(in);
  if (size_ == 1) return in.clone();
  const Traced traced(trace_.get(), "all_to_all", name_, in);
  at::Tensor out = at::empty_like(in);
  sp_buffer sb = buffer_of(in), rb = buffer_of(out);
  check(api_->all_to_all(comm_, &sb, &rb, nullptr), "all_to_all");
  return out;
}

void Communicator::send(const at::Tensor& t, int peer, int tag) {
  at::Tensor in = t.contiguous();
  count(in);
  const Traced traced(trace_.get(), "send", name_, in);
  sp_buffer b = buffer_of(in);
  check(api_->send(comm_, &b, peer, tag, nullptr), "send");
}

void Communicator::recv(at::Tensor& t, int peer, int tag) {
  const Traced traced(trace_.get(), "recv", name_, t);
  at::Tensor c = t.contiguous();
  sp_buffer b = buffer_of(c);
  check(api_->recv(comm_, &b, peer, tag, nullptr), "recv");
  if (!c.is_same(t)) t.copy_(c);
}

std::unique_ptr<Work> Communicator::send_async(const at::Tensor& t, int peer, int tag) {
  if (!t.is_contiguous()) throw Error("send_async on group '" + name_ + "' needs a contiguous tensor");
  count(t);
  auto call = issue("send", t);
  sp_buffer b = buffer_of(t);
  sp_work* w = nullptr;
  check(api_->send(comm_, &b, peer, tag, &w), "send");
  return traced(std::make_unique<Work>(api_, w, std::string(api_->name) + " send to rank " + std::to_string(peer) +
                                             " of group '" + name_ + "'",
                                std::vector<at::Tensor>{t}, timeout_),
                std::move(call));
}

std::unique_ptr<Work> Communicator::recv_async(at::Tensor& t, int peer, int tag) {
  if (!t.is_contiguous()) throw Error("recv_async on group '" + name_ + "' needs a contiguous tensor");
  auto call = issue("recv", t);
  sp_buffer b = buffer_of(t);
  sp_work* w = nullptr;
  check(api_->recv(comm_, &b, peer, tag, &w), "recv");
  return traced(std::make_unique<Work>(api_, w, std::string(api_->name) + " recv from rank " + std::to_string(peer) +
                                                    " of group '" + name_ + "'",
                                       std::vector<at::Tensor>{t}, timeout_),
                std::move(call));
}

void Communicator::barrier() {
  if (size_ > 1) stats_.calls += 1;
  const Traced traced(size_ > 1 ? trace_.get() : nullptr, "barrier", name_, at::Tensor());
  check(api_->barrier(comm_, nullptr), "barrier");
}

}  // namespace shardplan
