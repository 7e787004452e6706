#include "shardplan/mappings.h"

#include <torch/autograd.h>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "group_handle.h"
#include "base/shape_text.h"

namespace shardplan {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Out of place: the incoming tensor may be aliased by the autograd graph.
at::Tensor all_reduced(const at::Tensor& x, Communicator& g) { return g.all_reduced(x); }

at::Tensor own_chunk(const at::Tensor& x, Communicator& g, int64_t dim) {
  if (x.size(dim) % g.size() != 0)
    throw Error("cannot split dim " + std::to_string(dim) + " of size " + std::to_string(x.size(dim)) +
                " over group '" + g.name() + "' of " + std::to_string(g.size()) + " ranks");
  return x.chunk(g.size(), dim)[g.rank()].contiguous();
}

struct CopyToGroup : torch::autograd::Function<CopyToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group) {
    ctx->saved_data["group"] = group;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromGroup : torch::autograd::Function<ReduceFromGroup> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, int64_t group) {
    return all_reduced(x, group_at(group));
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct ScatterToGroup : torch::autograd::Function<ScatterToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return own_chunk(x, group_at(group), dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {saved_group(ctx).all_gather(grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct GatherFromGroup : torch::autograd::Function<GatherFromGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return group_at(group).all_gather(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {own_chunk(grads[0], saved_group(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterToGroup : torch::autograd::Function<ReduceScatterToGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return group_at(group).reduce_scatter(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {saved_group(ctx).all_gather(grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct AllGatherFromGroup : torch::autograd::Function<AllGatherFromGroup> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["dim"] = dim;
    return group_at(group).all_gather(x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {saved_group(ctx).reduce_scatter(grads[0], ctx->saved_data["dim"].toInt()), at::Tensor(),
            at::Tensor()};
  }
};

// The gradient of this rank's piece placed among zeros for every other
// piece, all-reduced: the holders of a piece add their parts at its place
// and the other ranks zeros, so each holder gets the sum over its fellows.
struct CopyToSharers : torch::autograd::Function<CopyToSharers> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& p, int64_t group, int64_t pieces, int64_t dim) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["pieces"] = pieces;
    ctx->saved_data["dim"] = dim;
    return p;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& g = saved_group(ctx);
    const int64_t pieces = ctx->saved_data["pieces"].toInt(), dim = ctx->saved_data["dim"].toInt();
    const int64_t len = grads[0].size(dim), index = g.rank() / (g.size() / pieces);
    std::vector<int64_t> sizes = grads[0].sizes().vec();
    sizes[dim] = pieces * len;
    at::Tensor all = at::zeros(sizes, grads[0].options());
    all.narrow(dim, index * len, len).copy_(grads[0]);
    g.all_reduce(all);
    return {all.narrow(dim, index * len, len), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

int64_t wrap(const at::Tensor& x, int64_t dim) { return at::maybe_wrap_dim(dim, x.dim()); }

}  // namespace

at::Tensor copy_to_group(const at::Tensor& x, Communicator& g) {
  if (g.size() == 1) return x;
  return CopyToGroup::apply(x, group_handle(g));
}

at::Tensor copy_to_sharers(const at::Tensor& p, Communicator& g, int64_t pieces, int64_t dim) {
  if (pieces < 1 || g.size() % pieces != 0)
    throw Error("copy_to_sharers: " + std::to_string(pieces) + " pieces cannot be shared evenly by group '" +
                g.name() + "' of " + std::to_string(g.size()) + " ranks");
  if (g.size() == 1) return p;
  if (pieces == 1) return copy_to_group(p, g);
  return CopyToSharers::apply(p, group_handle(g), pieces, wrap(p, dim));
}

at::Tensor reduce_from_group(const at::Tensor& x, Communicator& g) {
  if (g.size() == 1) return x;
  return ReduceFromGroup::apply(x, group_handle(g));
}

at::Tensor scatter_to_group(const at::Tensor& x, Communicator& g, int64_t dim) {
  if (g.size() == 1) return x;
  return ScatterToGroup::apply(x, group_handle(g), wrap(x, dim));
}

at::Tensor gather_from_group(const at::Tensor& x, Communicator& g, int64_t dim) {
  if (g.size() == 1) return x;
  return GatherFromGroup::apply(x, group_handle(g), wrap(x, dim));
}

at::Tensor reduce_scatter_to_group(const at::Tensor& x, Communicator& g, int64_t dim) {
  if (g.size() == 1) return x;
  return ReduceScatterToGroup::apply(x, group_handle(g), wrap(x, dim));
}

at::Tensor all_gather_from_group(const at::Tensor& x, Communicator& g, int64_t dim) {
  if (g.size() == 1) return x;
  return AllGatherFromGroup::apply(x, group_handle(g), wrap(x, dim));
}

namespace {
thread_local bool whole_sequence = false;
}  // namespace

WholeSequence::WholeSequence() : previous_(whole_sequence) { whole_sequence = true; }
WholeSequence::~WholeSequence() { whole_sequence = previous_; }
bool WholeSequence::active() { return whole_sequence; }

int64_t checked_sequence_dim(const at::Tensor& x, Communicator& g, int64_t dim, bool split) {
  const int64_t n = x.dim();
  if (dim < -n || dim >= n)
    throw Error("sequence parallel: sequence dim " + std::to_string(dim) + " does not exist in an activation of " +
                std::to_string(n) + " dims " + shape_str(x.sizes()) + " (check the plan's sequence_parallel.dim)");
  const int64_t d = dim < 0 ? dim + n : dim;
  if (split && !whole_sequence && x.size(d) % g.size() != 0)
    throw Error("sequence parallel: the sequence (dim " + std::to_string(d) + " of " + shape_str(x.sizes()) +
                ", length " + std::to_string(x.size(d)) + ") is not divisible by the " + std::to_string(g.size()) +
                " ranks of group '" + g.name() + "'; uneven sequences are not supported: pad or pick a length "
                "divisible by " + std::to_string(g.size()));
  return d;
}

at::Tensor gather_sequence(const at::Tensor& x, Communicator& g, int64_t dim) {
  const int64_t d = checked_sequence_dim(x, g, dim, false);
  if (g.size() == 1) return x;
  if (whole_sequence) return CopyToGroup::apply(x, group_handle(g));
  return AllGatherFromGroup::apply(x, group_handle(g), d);
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, Communicator& g, int64_t dim) {
  const int64_t d = checked_sequence_dim(x, g, dim, true);
  if (g.size() == 1) return x;
  if (whole_sequence) return ReduceFromGroup::apply(x, group_handle(g));
  return ReduceScatterToGroup::apply(x, group_handle(g), d);
}

at::Tensor split_sequence(const at::Tensor& x, Communicator& g, int64_t dim) {
  const int64_t d = checked_sequence_dim(x, g, dim, true);
  if (g.size() == 1 || whole_sequence) return x;
  return ScatterToGroup::apply(x, group_handle(g), d);
}

at::Tensor sequence_parallel_param(const at::Tensor& p, Communicator& g) {
  // Over the whole sequence every rank's gradient is already the whole one.
  if (!p.defined() || whole_sequence) return p;
  return copy_to_group(p, g);
}

}  // namespace shardplan
