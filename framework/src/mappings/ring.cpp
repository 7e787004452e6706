#include "shardplan/ring.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "group_handle.h"

namespace shardplan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Parts moving to the right (received from the left) and to the left carry
// different tags: at three ranks and more the two neighbours differ, but a
// rank's two streams must never be confused when they do not.
constexpr int kTagRight = 0x5201;
constexpr int kTagLeft = 0x5202;

// Hops each way: what moves right reaches the ranks 1..right to its right,
// what moves left 1..left to its left. Right + left = N - 1, except in Split
// mode, where each half goes all the way round.
struct Hops {
  int right, left;
};
Hops hops(int n, RingDirection d) {
  if (d == RingDirection::Unidirectional) return {n - 1, 0};
  if (d == RingDirection::Split) return {n - 1, n - 1};
  return {n / 2, (n - 1) / 2};
}

// The features each direction carries: all of them, or in Split mode the
// first half rightwards and the rest leftwards.
struct Ranges {
  int64_t right_begin, right_end, left_begin, left_end;
};
Ranges ranges(int64_t features, RingDirection d) {
  if (d != RingDirection::Split) return {0, features, 0, features};
  const int64_t half = features / 2;
  return {0, half, half, features};
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

// What both rings' backward needs besides the saved tensors.
struct RingArgs {
  Communicator& group;
  int64_t dim;
  RingDirection direction;
};
void save_args(AutogradContext* ctx, int64_t group, int64_t dim, int64_t direction) {
  ctx->saved_data["group"] = group;
  ctx->saved_data["dim"] = dim;
  ctx->saved_data["direction"] = direction;
}
RingArgs saved_args(AutogradContext* ctx) {
  return {saved_group(ctx), ctx->saved_data["dim"].toInt(),
          static_cast<RingDirection>(ctx->saved_data["direction"].toInt())};
}

// Split needs two halves to send.
RingDirection effective(RingDirection d, int64_t features) {
  return d == RingDirection::Split && features < 2 ? RingDirection::Unidirectional : d;
}

// x [..., in] times w [out, in] transposed, as [rows, out] x [rows, in]
// products for the weight's gradient.
at::Tensor flat(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

std::vector<at::Tensor> parts(const at::Tensor& t, int n, int64_t dim) {
  std::vector<at::Tensor> out;
  for (const auto& c : t.chunk(n, dim)) out.push_back(c.contiguous());
  return out;
}

// Each rank's whole tensor from the parts ring_gather handed over (in Split
// mode two halves of the features per rank).
struct Assembled {
  std::vector<std::vector<std::pair<int64_t, at::Tensor>>> pieces;  // per owner: (begin, part)
  explicit Assembled(int n) : pieces(n) {}
  void add(const RingPart& p) { pieces[p.owner].emplace_back(p.begin, p.data); }
  at::Tensor whole(int owner) {
    auto& v = pieces[owner];
    if (v.size() == 1) return v[0].second;
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<at::Tensor> t;
    for (auto& [b, x] : v) t.push_back(x);
    return at::cat(t, -1);
  }
};

struct RingGatherLinear : torch::autograd::Function<RingGatherLinear> {
  // The bias is added outside (autograd takes no undefined inputs here).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t group,
                            int64_t dim, int64_t direction) {
    Communicator& g = group_at(group);
    const auto dir = static_cast<RingDirection>(direction);
    std::vector<at::Tensor> out(g.size());
    Assembled seen(g.size());
    ring_gather(x, g, dir, [&](const RingPart& p) {
      // A half of the input features meets the same half of w's columns.
      at::Tensor y = at::linear(p.data, w.narrow(1, p.begin, p.end - p.begin));
      out[p.owner] = out[p.owner].defined() ? out[p.owner] + y : y;
      seen.add(p);
    });
    // The gathered input is kept for the weight's gradient, as the
    // collective path keeps it: gathering it again in backward would move
    // half as many bytes again.
    std::vector<at::Tensor> whole;
    for (int o = 0; o < g.size(); ++o) whole.push_back(seen.whole(o));
    ctx->save_for_backward({at::cat(whole, dim), w});
    save_args(ctx, group, dim, direction);
    return at::cat(out, dim);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& w = saved[1];
    const RingArgs a = saved_args(ctx);
    const std::vector<at::Tensor> gy = parts(grads[0], a.group.size(), a.dim);
    const std::vector<at::Tensor> xs = parts(saved[0], a.group.size(), a.dim);
    // d x_r = sum over ranks of gy[r] w, reduced on the ring; d w = sum over
    // parts of gy[p]^T x_p, accumulated as the ring visits each part (each
    // owner's features once).
    at::Tensor gw = at::zeros_like(w);
    at::Tensor gx = ring_reduce_scatter(a.group, a.direction, w.size(1), [&](int owner, int64_t b, int64_t e) {
      gw.narrow(1, b, e - b).addmm_(flat(gy[owner]).t(), flat(xs[owner].narrow(-1, b, e - b)));
      return at::matmul(gy[owner], w.narrow(1, b, e - b));
    });
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct RingLinearReduceScatter : torch::autograd::Function<RingLinearReduceScatter> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, int64_t group,
                            int64_t dim, int64_t direction) {
    Communicator& g = group_at(group);
    const std::vector<at::Tensor> xs = parts(x, g.size(), dim);
    at::Tensor y = ring_reduce_scatter(g, static_cast<RingDirection>(direction), w.size(0),
                                       [&](int owner, int64_t b, int64_t e) {
                                         return at::linear(xs[owner], w.narrow(0, b, e - b));
                                       });
    ctx->save_for_backward({x, w});
    save_args(ctx, group, dim, direction);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& w = saved[1];
    const RingArgs a = saved_args(ctx);
    const std::vector<at::Tensor> xs = parts(x, a.group.size(), a.dim);
    // One gather ring of the output's gradient serves both: each part p
    // gives d x_p = gy_p w and adds gy_p^T x_p to d w (per half of the
    // output features in Split mode).
    std::vector<at::Tensor> gx(a.group.size());
    at::Tensor gw = at::zeros_like(w);
    ring_gather(grads[0].contiguous(), a.group, a.direction, [&](const RingPart& p) {
      const at::Tensor rows = w.narrow(0, p.begin, p.end - p.begin);
      at::Tensor d = at::matmul(p.data, rows);
      gx[p.owner] = gx[p.owner].defined() ? gx[p.owner] + d : d;
      gw.narrow(0, p.begin, p.end - p.begin).addmm_(flat(p.data).t(), flat(xs[p.owner]));
    });
    return {at::cat(gx, a.dim), gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void ring_gather(const at::Tensor& x, Communicator& g, RingDirection direction,
                 const std::function<void(const RingPart& part)>& visit) {
  direction = effective(direction, x.dim() ? x.size(-1) : 1);
  const int n = g.size(), r = g.rank();
  const Hops h = hops(n, direction);
  const int right = mod(r + 1, n), left = mod(r - 1, n);
  const at::Tensor own = x.contiguous();
  const int64_t features = own.dim() ? own.size(-1) : 1;
  const Ranges f = ranges(features, direction);
  auto slice = [&](int64_t b, int64_t e) {
    return direction == RingDirection::Split ? own.narrow(-1, b, e - b).contiguous() : own;
  };
  Exchange from_left, from_right;  // parts moving right, parts moving left
  // Step k brings the parts k hops away; each is passed on at once while the
  // parts that arrived are multiplied.
  if (h.right >= 1) from_left.post(g, slice(f.right_begin, f.right_end), right, left, kTagRight);
  if (h.left >= 1) from_right.post(g, slice(f.left_begin, f.left_end), left, right, kTagLeft);
  visit(RingPart{own, r, 0, features});
  for (int k = 1; k <= std::max(h.right, h.left); ++k) {
    at::Tensor moving_right, moving_left;
    if (k <= h.right) moving_right = from_left.finish();
    if (k <= h.left) moving_left = from_right.finish();
    if (k < h.right) from_left.post(g, moving_right, right, left, kTagRight);
    if (k < h.left) from_right.post(g, moving_left, left, right, kTagLeft);
    if (moving_right.defined()) visit(RingPart{moving_right, mod(r - k, n), f.right_begin, f.right_end});
    if (moving_left.defined()) visit(RingPart{moving_left, mod(r + k, n), f.left_begin, f.left_end});
  }
}

at::Tensor ring_reduce_scatter(Communicator& g, RingDirection direction, int64_t features,
                               const std::function<at::Tensor(int owner, int64_t begin, int64_t end)>& partial) {
  direction = effective(direction, features);
  const int n = g.size(), r = g.rank();
  if (n == 1) return partial(0, 0, features);
  const Hops h = hops(n, direction);
  const Ranges f = ranges(features, direction);
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
    at::Tensor p_right = s < h.right ? partial(mod(r + h.right - s, n), f.right_begin, f.right_end) : at::Tensor();
    at::Tensor p_left = s < h.left ? partial(mod(r - h.left + s, n), f.left_begin, f.left_end) : at::Tensor();
    if (s == steps) result = partial(r, 0, features);
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
  if (direction == RingDirection::Split) return result + at::cat({arrived_right, arrived_left}, -1);
  if (arrived_right.defined()) result = result + arrived_right;
  if (arrived_left.defined()) result = result + arrived_left;
  return result;
}

at::Tensor ring_gather_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, Communicator& g,
                              int64_t dim, RingDirection direction) {
  const int64_t d = checked_sequence_dim(x, g, dim, false);
  if (g.size() == 1) return at::linear(x, w, b);
  if (WholeSequence::active()) return at::linear(copy_to_group(x, g), w, b);
  at::Tensor y = RingGatherLinear::apply(x, w, group_handle(g), d, static_cast<int64_t>(direction));
  return b.defined() ? y + b : y;
}

at::Tensor ring_linear_reduce_scatter(const at::Tensor& x, const at::Tensor& w, Communicator& g, int64_t dim,
                                      RingDirection direction) {
  const int64_t d = checked_sequence_dim(x, g, dim, true);
  if (g.size() == 1) return at::linear(x, w);
  if (WholeSequence::active()) return reduce_from_group(at::linear(x, w), g);
  return RingLinearReduceScatter::apply(x, w, group_handle(g), d, static_cast<int64_t>(direction));
}

}  // namespace shardplan
