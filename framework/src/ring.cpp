#include "shardplan/ring.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <memory>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"

namespace shardplan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Parts moving to the right (received from the left) and to the left carry
// different tags: at three ranks and more the two neighbours differ, but a
// rank's two streams must never be confused when they do not.
constexpr int kTagRight = 0x5201;
constexpr int kTagLeft = 0x5202;

// Hops each way: a part reaches the ranks 1..right to its right and 1..left
// to its left, right + left = N - 1.
struct Hops {
  int right, left;
};
Hops hops(int n, RingDirection d) {
  if (d == RingDirection::Unidirectional) return {n - 1, 0};
  return {n / 2, (n - 1) / 2};
}

int mod(int a, int n) { return ((a % n) + n) % n; }

struct Exchange {
  std::unique_ptr<Work> send, recv;
  at::Tensor in;
  void post(Communicator& g, const at::Tensor& out, int to, int from, int tag) {
    in = at::empty_like(out);
    recv = g.recv_async(in, from, tag);
    send = g.send_async(out, to, tag);
  }
  at::Tensor finish() {
    recv->wait();
    send->wait();
    recv.reset();
    send.reset();
    return in;
  }
};

int64_t handle(Communicator& g) { return reinterpret_cast<int64_t>(&g); }
Communicator& group_of(const c10::IValue& v) { return *reinterpret_cast<Communicator*>(v.toInt()); }

// x [..., in] times w [out, in] transposed, as [rows, out] x [rows, in]
// products for the weight's gradient.
at::Tensor flat(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

std::vector<at::Tensor> parts(const at::Tensor& t, int n, int64_t dim) {
  std::vector<at::Tensor> out;
  for (const auto& c : t.chunk(n, dim)) out.push_back(c.contiguous());
  return out;
}

struct RingGatherLinear : torch::autograd::Function<RingGatherLinear> {
  // The bias is added outside (autograd takes no undefined inputs here).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t group,
                            int64_t dim, int64_t direction) {
    Communicator& g = *reinterpret_cast<Communicator*>(group);
    const auto dir = static_cast<RingDirection>(direction);
    std::vector<at::Tensor> out(g.size()), seen(g.size());
    ring_gather(x, g, dir, [&](const at::Tensor& part, int owner) {
      out[owner] = at::linear(part, w);
      seen[owner] = part;
    });
    // The gathered input is kept for the weight's gradient, as the
    // collective path keeps it: gathering it again in backward would move
    // half as many bytes again.
    ctx->save_for_backward({at::cat(seen, dim), w});
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["direction"] = direction;
    return at::cat(out, dim);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[1];
    Communicator& g = group_of(ctx->saved_data["group"]);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const auto dir = static_cast<RingDirection>(ctx->saved_data["direction"].toInt());
    const std::vector<at::Tensor> gy = parts(grads[0], g.size(), dim);
    const std::vector<at::Tensor> xs = parts(saved[0], g.size(), dim);
    // d x_r = sum over ranks of gy[r] w, reduced on the ring; d w = sum over
    // parts of gy[p]^T x_p, accumulated as the ring visits each part.
    at::Tensor gw = at::zeros_like(w);
    at::Tensor gx = ring_reduce_scatter(g, dir, [&](int owner) {
      gw.addmm_(flat(gy[owner]).t(), flat(xs[owner]));
      return at::matmul(gy[owner], w);
    });
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct RingLinearReduceScatter : torch::autograd::Function<RingLinearReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t group,
                            int64_t dim, int64_t direction) {
    Communicator& g = *reinterpret_cast<Communicator*>(group);
    const auto dir = static_cast<RingDirection>(direction);
    const std::vector<at::Tensor> xs = parts(x, g.size(), dim);
    at::Tensor y = ring_reduce_scatter(g, dir, [&](int owner) { return at::linear(xs[owner], w); });
    ctx->save_for_backward({x, w});
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    ctx->saved_data["direction"] = direction;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    Communicator& g = group_of(ctx->saved_data["group"]);
    const int64_t dim = ctx->saved_data["dim"].toInt();
    const auto dir = static_cast<RingDirection>(ctx->saved_data["direction"].toInt());
    const std::vector<at::Tensor> xs = parts(x, g.size(), dim);
    // One gather ring of the output's gradient serves both: each part p
    // gives d x_p = gy_p w and adds gy_p^T x_p to d w.
    std::vector<at::Tensor> gx(g.size());
    at::Tensor gw = at::zeros_like(w);
    ring_gather(grads[0].contiguous(), g, dir, [&](const at::Tensor& gy, int owner) {
      gx[owner] = at::matmul(gy, w);
      gw.addmm_(flat(gy).t(), flat(xs[owner]));
    });
    return {at::cat(gx, dim), gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void ring_gather(const at::Tensor& x, Communicator& g, RingDirection direction,
                 const std::function<void(const at::Tensor& part, int owner)>& visit) {
  const int n = g.size(), r = g.rank();
  const Hops h = hops(n, direction);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const at::Tensor own = x.contiguous();
  Exchange from_left, from_right;  // parts moving right, parts moving left
  // Step k brings the parts k hops away; each is passed on at once while the
  // parts that arrived are multiplied.
  if (h.right >= 1) from_left.post(g, own, right, left, kTagRight);
  if (h.left >= 1) from_right.post(g, own, left, right, kTagLeft);
  visit(own, r);
  for (int k = 1; k <= h.right; ++k) {
    const at::Tensor moving_right = from_left.finish();
    at::Tensor moving_left;
    if (k <= h.left) moving_left = from_right.finish();
    if (k < h.right) from_left.post(g, moving_right, right, left, kTagRight);
    if (k < h.left) from_right.post(g, moving_left, left, right, kTagLeft);
    visit(moving_right, mod(r - k, n));
    if (moving_left.defined()) visit(moving_left, mod(r + k, n));
  }
}

at::Tensor ring_reduce_scatter(Communicator& g, RingDirection direction,
                               const std::function<at::Tensor(int owner)>& partial) {
  const int n = g.size(), r = g.rank();
  if (n == 1) return partial(0);
  const Hops h = hops(n, direction);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  // The running sum for part c moving right starts `h.right` ranks to c's
  // left and gains one rank's partial per hop; at step s this rank holds the
  // one for part r + h.right - s. Likewise leftwards from h.left to c's right.
  Exchange from_left, from_right;
  at::Tensor arrived_right, arrived_left;  // complete but for this rank's own partial
  const int steps = std::max(h.right, h.left);
  at::Tensor result;
  for (int s = 0; s <= steps; ++s) {
    // Computed while the sums sent last step are in flight.
    at::Tensor p_right = s < h.right ? partial(mod(r + h.right - s, n)) : at::Tensor();
    at::Tensor p_left = s < h.left ? partial(mod(r - h.left + s, n)) : at::Tensor();
    if (s == steps) result = partial(r);
    if (s >= 1 && s <= h.right) {
      at::Tensor in = from_left.finish();
      if (s < h.right) p_right = in.add_(p_right);
      else arrived_right = in;
    }
    if (s >= 1 && s <= h.left) {
      at::Tensor in = from_right.finish();
      if (s < h.left) p_left = in.add_(p_left);
      else arrived_left = in;
    }
    if (s < h.right) from_left.post(g, p_right.contiguous(), right, left, kTagRight);
    if (s < h.left) from_right.post(g, p_left.contiguous(), left, right, kTagLeft);
  }
  if (arrived_right.defined()) result = result + arrived_right;
  if (arrived_left.defined()) result = result + arrived_left;
  return result;
}

at::Tensor ring_gather_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Communicator& g,
                              int64_t dim, RingDirection direction) {
  const int64_t d = checked_sequence_dim(x, g, dim, false);
  if (g.size() == 1) return at::linear(x, w, b);
  at::Tensor y = RingGatherLinear::apply(x, w, handle(g), d, static_cast<int64_t>(direction));
  return b.defined() ? y + b : y;
}

at::Tensor ring_linear_reduce_scatter(const at::Tensor& x, const at::Tensor& w, Communicator& g, int64_t dim,
                                      RingDirection direction) {
  const int64_t d = checked_sequence_dim(x, g, dim, true);
  if (g.size() == 1) return at::linear(x, w);
  return RingLinearReduceScatter::apply(x, w, handle(g), d, static_cast<int64_t>(direction));
}

}  // namespace shardplan
