#include "shardplan/nn/multihead_attention.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/types.h>

#include <cmath>
#include <limits>
#include <ostream>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/nn/deferred_init.h"
#include "shardplan/random.h"

namespace shardplan {
namespace nn {

namespace {

// A mask over source positions grown by one unmasked column (for bias_k/v or
// the zero attention row): torch pads a 2-D mask with zeros({L, 1}) along
// dim 1; a 3-D one is padded the same way along its last dim.
at::Tensor pad_source(const at::Tensor& mask) {
  auto sizes = mask.sizes().vec();
  sizes.back() = 1;
  return torch::cat({mask, torch::zeros(sizes, at::TensorOptions(mask.dtype()).device(mask.device()))},
                    /*dim=*/mask.dim() - 1);
}

}  // namespace

MultiheadAttentionImpl::MultiheadAttentionImpl(const torch::nn::MultiheadAttentionOptions& options_)
    : torch::nn::Module("shardplan::nn::MultiheadAttention"), options(options_) {
  reset();
}

// Mirrors torch::nn::MultiheadAttentionImpl::reset: the same registrations in
// the same order (out_proj draws its Linear initialisation before
// _reset_parameters), so both draw the same numbers from the same generator.
void MultiheadAttentionImpl::reset() {
  _qkv_same_embed_dim = options.kdim() == options.embed_dim() && options.vdim() == options.embed_dim();
  head_dim = options.embed_dim() / options.num_heads();
  TORCH_CHECK(head_dim * options.num_heads() == options.embed_dim(), "embed_dim must be divisible by num_heads");
  if (!_qkv_same_embed_dim) {
    q_proj_weight = register_parameter("q_proj_weight", empty_parameter({options.embed_dim(), options.embed_dim()}));
    k_proj_weight = register_parameter("k_proj_weight", empty_parameter({options.embed_dim(), options.kdim()}));
    v_proj_weight = register_parameter("v_proj_weight", empty_parameter({options.embed_dim(), options.vdim()}));
    register_parameter("in_proj_weight", {}, /*requires_grad=*/false);
  } else {
    in_proj_weight = register_parameter("in_proj_weight", empty_parameter({3 * options.embed_dim(), options.embed_dim()}));
    register_parameter("q_proj_weight", {}, /*requires_grad=*/false);
    register_parameter("k_proj_weight", {}, /*requires_grad=*/false);
    register_parameter("v_proj_weight", {}, /*requires_grad=*/false);
  }
  if (options.bias()) {
    in_proj_bias = register_parameter("in_proj_bias", empty_parameter(3 * options.embed_dim()));
  } else {
    register_parameter("in_proj_bias", {}, /*requires_grad=*/false);
  }
  out_proj = register_module(
      "out_proj", Linear(torch::nn::LinearOptions(options.embed_dim(), options.embed_dim()).bias(options.bias())));
  if (options.add_bias_kv()) {
    bias_k = register_parameter("bias_k", empty_parameter({1, 1, options.embed_dim()}));
    bias_v = register_parameter("bias_v", empty_parameter({1, 1, options.embed_dim()}));
  } else {
    bias_k.reset();
    bias_v.reset();
  }
  if (!deferring()) _reset_parameters();
}

void MultiheadAttentionImpl::_reset_parameters() {
  using namespace torch::nn::init;
  if (_qkv_same_embed_dim) {
    xavier_uniform_(in_proj_weight);
  } else {
    xavier_uniform_(q_proj_weight);
    xavier_uniform_(k_proj_weight);
    xavier_uniform_(v_proj_weight);
  }
  if (in_proj_bias.defined()) {
    constant_(in_proj_bias, 0.);
    constant_(out_proj->bias, 0.);
  }
  if (bias_k.defined()) xavier_normal_(bias_k);
  if (bias_v.defined()) xavier_normal_(bias_v);
}

void MultiheadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "shardplan::nn::MultiheadAttention";
  if (strategy_) stream << "(" << strategy_->describe() << ")";
}

// torch::nn::functional::detail::multi_head_attention_forward (libtorch 1.13,
// unchanged in 2.x) up to the output projection, op for op. The differences
// are the ones the header lists (bool and 3-D masks, kdim != vdim) and that
// the embed dim and head count are those the parameters hold.
std::tuple<at::Tensor, at::Tensor> MultiheadAttentionImpl::attend(const at::Tensor& query, const at::Tensor& key,
                                                                  const at::Tensor& value,
                                                                  const at::Tensor& key_padding_mask,
                                                                  const at::Tensor& attn_mask) {
  namespace F = torch::nn::functional;
  TORCH_CHECK(query.dim() == 3 && key.dim() == 3 && value.dim() == 3,
              "MultiheadAttention: query, key and value must be [L, N, E] (sequence first), got ", query.sizes(),
              ", ", key.sizes(), " and ", value.sizes());
  TORCH_CHECK(query.size(2) == options.embed_dim(), "MultiheadAttention: query has ", query.size(2),
              " features but embed_dim is ", options.embed_dim());
  TORCH_CHECK(key.size(0) == value.size(0) && key.size(1) == value.size(1),
              "MultiheadAttention: key and value must have the same length and batch, got ", key.sizes(), " and ",
              value.sizes());
  const int64_t tgt_len = query.size(0);
  const int64_t bsz = query.size(1);
  // The rows of q this module holds: all of embed_dim, or this rank's heads'.
  const int64_t embed_dim = _qkv_same_embed_dim ? in_proj_weight.size(0) / 3 : q_proj_weight.size(0);
  const int64_t num_heads = embed_dim / head_dim;
  const auto scaling = 1 / std::sqrt(head_dim);

  at::Tensor q, k, v;
  if (_qkv_same_embed_dim) {
    if (torch::equal(query, key) && torch::equal(key, value)) {
      const auto chunks = F::linear(query, in_proj_weight, in_proj_bias).chunk(3, /*dim=*/-1);
      q = chunks[0];
      k = chunks[1];
      v = chunks[2];
    } else if (torch::equal(key, value)) {
      auto _b = in_proj_bias;
      auto _w = in_proj_weight.slice(/*dim=*/0, 0, embed_dim);
      if (_b.defined()) _b = _b.slice(/*dim=*/0, 0, embed_dim);
      q = F::linear(query, _w, _b);
      _b = in_proj_bias;
      _w = in_proj_weight.slice(/*dim=*/0, embed_dim);
      if (_b.defined()) _b = _b.slice(/*dim=*/0, embed_dim);
      const auto chunks = F::linear(key, _w, _b).chunk(2, /*dim=*/-1);
      k = chunks[0];
      v = chunks[1];
    } else {
      auto _b = in_proj_bias;
      auto _w = in_proj_weight.slice(/*dim=*/0, 0, embed_dim);
      if (_b.defined()) _b = _b.slice(/*dim=*/0, 0, embed_dim);
      q = F::linear(query, _w, _b);
      _b = in_proj_bias;
      _w = in_proj_weight.slice(/*dim=*/0, embed_dim, embed_dim * 2);
      if (_b.defined()) _b = _b.slice(/*dim=*/0, embed_dim, embed_dim * 2);
      k = F::linear(key, _w, _b);
      _b = in_proj_bias;
      _w = in_proj_weight.slice(/*dim=*/0, embed_dim * 2);
      if (_b.defined()) _b = _b.slice(0, embed_dim * 2);
      v = F::linear(value, _w, _b);
    }
  } else {
    TORCH_CHECK(key.size(-1) == k_proj_weight.size(1) && value.size(-1) == v_proj_weight.size(1),
                "MultiheadAttention: key and value must have kdim ", options.kdim(), " and vdim ", options.vdim(),
                " features, got ", key.size(-1), " and ", value.size(-1));
    if (in_proj_bias.defined()) {
      q = F::linear(query, q_proj_weight, in_proj_bias.slice(/*dim=*/0, 0, embed_dim));
      k = F::linear(key, k_proj_weight, in_proj_bias.slice(/*dim=*/0, embed_dim, (embed_dim * 2)));
      v = F::linear(value, v_proj_weight, in_proj_bias.slice(/*dim=*/0, (embed_dim * 2)));
    } else {
      q = F::linear(query, q_proj_weight, in_proj_bias);
      k = F::linear(key, k_proj_weight, in_proj_bias);
      v = F::linear(value, v_proj_weight, in_proj_bias);
    }
  }
  q = q * scaling;
  at::Tensor attn_mask_ = attn_mask;
  at::Tensor key_padding_mask_ = key_padding_mask;
  if (attn_mask_.defined())
    TORCH_CHECK(attn_mask_.dim() == 2 || attn_mask_.dim() == 3,
                "MultiheadAttention: attn_mask must be [L, S] or [N * num_heads, L, S], got ", attn_mask_.sizes());
  if (bias_k.defined() && bias_v.defined()) {
    k = torch::cat({k, bias_k.repeat({1, bsz, 1})});
    v = torch::cat({v, bias_v.repeat({1, bsz, 1})});
    if (attn_mask_.defined()) attn_mask_ = pad_source(attn_mask_);
    if (key_padding_mask_.defined()) key_padding_mask_ = pad_source(key_padding_mask_);
  } else {
    TORCH_CHECK(!bias_k.defined());
    TORCH_CHECK(!bias_v.defined());
  }
  q = q.contiguous().view({tgt_len, bsz * num_heads, head_dim}).transpose(0, 1);
  k = k.contiguous().view({-1, bsz * num_heads, head_dim}).transpose(0, 1);
  v = v.contiguous().view({-1, bsz * num_heads, head_dim}).transpose(0, 1);
  if (cache_) std::tie(k, v) = cache_->append(k, v);
  auto src_len = k.size(1);
  if (key_padding_mask_.defined()) {
    TORCH_CHECK(key_padding_mask_.dim() == 2 && key_padding_mask_.size(0) == bsz &&
                    key_padding_mask_.size(1) == src_len,
                "MultiheadAttention: key_padding_mask must be [N, S] = [", bsz, ", ",
                src_len - (bias_k.defined() ? 1 : 0), "], got ", key_padding_mask.sizes());
  }
  if (options.add_zero_attn()) {
    src_len += 1;
    auto k_sizes = k.sizes().vec();
    k_sizes[1] = 1;
    k = torch::cat({k, torch::zeros(k_sizes, at::TensorOptions(k.dtype()).device(k.device()))}, /*dim=*/1);
    auto v_sizes = v.sizes().vec();
    v_sizes[1] = 1;
    v = torch::cat({v, torch::zeros(v_sizes, at::TensorOptions(v.dtype()).device(v.device()))}, /*dim=*/1);
    if (attn_mask_.defined()) attn_mask_ = pad_source(attn_mask_);
    if (key_padding_mask_.defined()) key_padding_mask_ = pad_source(key_padding_mask_);
  }
  if (attn_mask_.defined()) {
    const bool per_head = attn_mask_.dim() == 3;
    TORCH_CHECK(per_head ? attn_mask_.sizes() == at::IntArrayRef({bsz * num_heads, tgt_len, src_len})
                         : (attn_mask_.size(0) == tgt_len && attn_mask_.size(1) == src_len),
                "MultiheadAttention: attn_mask must be [L, S] = [", tgt_len, ", ", src_len, "] or [N * num_heads, L, S] = [",
                bsz * num_heads, ", ", tgt_len, ", ", src_len, "] (S counting bias_k and the zero attention), got ",
                attn_mask.sizes());
  }
  // Selective recomputation keeps q, k, v and the masks of what follows.
  const std::vector<at::Tensor> out = recompute_selective(
      [this, bsz, num_heads](const std::vector<at::Tensor>& in) {
        return core(in[0], in[1], in[2], in[3], in[4], bsz, num_heads);
      },
      {q, k, v, attn_mask_, key_padding_mask_});
  return std::make_tuple(out[0], out[1]);
}

std::vector<at::Tensor> MultiheadAttentionImpl::core(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                     const at::Tensor& attn_mask, const at::Tensor& key_padding_mask,
                                                     int64_t bsz, int64_t num_heads) {
  namespace F = torch::nn::functional;
  const int64_t tgt_len = q.size(1), src_len = k.size(1), embed_dim = num_heads * head_dim;
  at::Tensor attn_mask_ = attn_mask;
  auto attn_output_weights = torch::bmm(q, k.transpose(1, 2));
  if (attn_mask_.defined()) {
    if (attn_mask_.dim() != 3) attn_mask_ = attn_mask_.unsqueeze(0);
    if (attn_mask_.scalar_type() == at::kBool)
      attn_output_weights = attn_output_weights.masked_fill(attn_mask_, -std::numeric_limits<double>::infinity());
    else
      attn_output_weights += attn_mask_;
  }
  if (key_padding_mask.defined()) {
    attn_output_weights = attn_output_weights.view({bsz, num_heads, tgt_len, src_len});
    attn_output_weights = attn_output_weights.masked_fill(key_padding_mask.unsqueeze(1).unsqueeze(2),
                                                          -std::numeric_limits<double>::infinity());
    attn_output_weights = attn_output_weights.view({bsz * num_heads, tgt_len, src_len});
  }
  attn_output_weights = F::softmax(attn_output_weights, /*dim=*/-1);
  // With no RNG tracker current this is F::dropout; after parallelize() the
  // mask comes from the rank's stream (replicated, or sharded inside the
  // strategy's RngFork).
  attn_output_weights = shardplan::dropout(attn_output_weights, options.dropout(), is_training());
  // Its result is what backward does not need: a selective rerun skips it.
  auto attn_output = shardplan::recompute_final_bmm(attn_output_weights, v);
  attn_output = attn_output.transpose(0, 1).contiguous().view({tgt_len, bsz, embed_dim});
  return {attn_output, attn_output_weights};
}

std::tuple<at::Tensor, at::Tensor> MultiheadAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key,
                                                                   const at::Tensor& value,
                                                                   const at::Tensor& key_padding_mask,
                                                                   bool need_weights, const at::Tensor& attn_mask,
                                                                   bool average_attn_weights) {
  const ParamGateScope gate(*this);
  for (const at::Tensor* p : {&in_proj_weight, &q_proj_weight, &k_proj_weight, &v_proj_weight, &in_proj_bias, &bias_k,
                              &bias_v})
    check_materialized(*p, "shardplan::nn::MultiheadAttention", "parameter");
  if (strategy_)
    return gate.out(strategy_->forward(*this, query, key, value, key_padding_mask, need_weights, attn_mask,
                                       average_attn_weights));
  if (const auto& s = out_proj->strategy())
    if (s->sharded_input_group() && s->sharded_input_group()->size() > 1)
      throw Error(
          "shardplan::nn::MultiheadAttention: out_proj is row-parallel with `input: sharded`, but the attention heads "
          "are not split, so its input arrives whole: give in_proj_weight (or q/k/v_proj_weight) the layout "
          "[axis, null] over the same axis, or drop `input: sharded` from the out_proj rule");
  at::Tensor attn_output, attn_output_weights;
  std::tie(attn_output, attn_output_weights) = attend(query, key, value, key_padding_mask, attn_mask);
  attn_output = out_proj->forward(attn_output);
  if (!need_weights) return gate.out(std::make_tuple(attn_output, at::Tensor()));
  const int64_t num_heads = options.num_heads();
  attn_output_weights =
      attn_output_weights.view({query.size(1), num_heads, query.size(0), attn_output_weights.size(-1)});
  if (average_attn_weights) attn_output_weights = attn_output_weights.sum(/*dim=*/1) / num_heads;
  return gate.out(std::make_tuple(attn_output, attn_output_weights));
}

at::Tensor MultiheadAttentionImpl::forward_cached(const at::Tensor& x, KVCache& cache, const at::Tensor& attn_mask) {
  if (bias_k.defined() || options.add_zero_attn())
    throw Error(
        "shardplan::nn::MultiheadAttention::forward_cached: bias_k/bias_v and add_zero_attn add a key position to "
        "every forward, which a key/value cache cannot hold; decode without the cache");
  // Reset on the way out, a throw included, so a later plain forward() never
  // appends to a cache it was not given.
  struct Active {
    KVCache*& slot;
    ~Active() { slot = nullptr; }
  } active{cache_};
  cache_ = &cache;
  return std::get<0>(forward(x, x, x, {}, /*need_weights=*/false, attn_mask));
}

}  // namespace nn
}  // namespace shardplan
