#include "models/generate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <optional>

#include <torch/nn/module.h>

#include "models/model.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/mappings.h"
#include "shardplan/nn/linear.h"

namespace shardplan {
namespace examples {

double Generation::tokens_per_second() const {
  return tokens.defined() ? static_cast<double>(tokens.numel()) / std::max(seconds, 1e-9) : 0;
}

double Generation::prefill_tokens_per_second() const {
  return static_cast<double>(prompt_tokens) / std::max(prefill_seconds, 1e-9);
}

double Generation::decode_tokens_per_second() const {
  if (!tokens.defined() || tokens.size(1) < 2) return 0;
  return static_cast<double>(tokens.size(0) * (tokens.size(1) - 1)) / std::max(seconds - prefill_seconds, 1e-9);
}

void check_generation(const CausalLM& model, int64_t prompt_tokens, const GenerateOptions& o) {
  const int64_t context = model.context_size(), vocab = model.vocab_size();
  if (prompt_tokens < 1) throw Error("generate: the prompt is empty; give at least one token (--prompt TEXT)");
  if (prompt_tokens > context)
    throw Error("generate: the prompt has " + std::to_string(prompt_tokens) + " tokens, longer than the context of " +
                std::to_string(context));
  if (o.new_tokens < 1) throw Error("generate: the number of new tokens must be at least 1");
  if (prompt_tokens + o.new_tokens > context)
    throw Error("generate: the prompt's " + std::to_string(prompt_tokens) + " tokens + " +
                std::to_string(o.new_tokens) + " new tokens exceed the context of " + std::to_string(context) +
                " (the cache does not slide: generate at most " + std::to_string(context - prompt_tokens) +
                ", or train with a longer context)");
  if (!(o.temperature >= 0) || o.temperature == std::numeric_limits<double>::infinity())
    throw Error("generate: the temperature must be a finite number >= 0 (0: greedy)");
  if (o.sequence_parts < 1)
    throw Error("generate: sequence_parts must be at least 1, got " + std::to_string(o.sequence_parts));
  if (o.top_k < 0 || o.top_k > vocab)
    throw Error("generate: top-k must be between 0 (all) and the vocabulary " + std::to_string(vocab) +
                ", got " + std::to_string(o.top_k));
}

at::Tensor vocab_whole(const shardplan::nn::LinearImpl& head, const at::Tensor& logits) {
  const auto& s = head.strategy();
  Communicator* group = s ? s->sharded_output_group() : nullptr;
  return group && group->size() > 1 ? gather_from_group(logits, *group, -1) : logits;
}

at::Tensor next_token(const at::Tensor& logits, const GenerateOptions& o, at::Generator& gen) {
  // In float64 whatever the model's dtype, so that rounding in the softmax
  // cannot tip a draw between a float32 and a float64 run.
  at::Tensor l = logits.to(at::kDouble);
  if (o.temperature == 0 || o.top_k == 1) return l.argmax(-1);
  if (o.top_k > 0 && o.top_k < l.size(-1)) {
    const at::Tensor kth = std::get<0>(l.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    l = l.masked_fill(l < kth, -std::numeric_limits<double>::infinity());
  }
  return at::multinomial(at::softmax(l / o.temperature, -1), 1, /*replacement=*/false, gen).squeeze(-1);
}

Generation generate(CausalLM& model, const at::Tensor& prompt, const GenerateOptions& o, at::Generator& gen,
                    Communicator* agree) {
  if (prompt.dim() != 2 || prompt.scalar_type() != at::kLong)
    throw Error("generate: the prompt must be [batch, tokens] long token ids");
  check_generation(model, prompt.size(1), o);
  const int64_t vocab = model.vocab_size();
  if (prompt.numel() > 0 && (prompt.min().item<int64_t>() < 0 || prompt.max().item<int64_t>() >= vocab))
    throw Error("generate: prompt token ids must be in [0, " + std::to_string(vocab) + ")");

  at::NoGradGuard no_grad;
  auto& module = dynamic_cast<torch::nn::Module&>(model);
  const bool was_training = module.is_training();
  module.eval();
  Generation g;
  const auto start = std::chrono::steady_clock::now();
  auto caches = model.make_caches();
  std::vector<at::Tensor> out;
  out.reserve(o.new_tokens);
  // A prompt that divides keeps sequence parallelism's split activations;
  // everything after it is one position at a time, which cannot be split.
  std::optional<WholeSequence> whole;
  if (o.sequence_parts > 1 && prompt.size(1) % o.sequence_parts != 0) whole.emplace();
  at::Tensor logits = model.forward_cached(prompt, caches);  // [T, B, V]
  if (o.sequence_parts > 1 && !whole) whole.emplace();
  at::Tensor stop_ids = at::tensor(o.stop_ids, at::kLong);
  at::Tensor stopped = at::zeros({prompt.size(0)}, at::kBool);  // rows that picked a stop id
  for (int64_t i = 0; i < o.new_tokens; ++i) {
    at::Tensor next = next_token(logits.select(0, logits.size(0) - 1), o, gen);  // [B]
    if (!o.stop_ids.empty()) {
      next = at::where(stopped, out.empty() ? next : out.back(), next);
      stopped = stopped.logical_or(at::isin(next, stop_ids));
    }
    out.push_back(next);
    if (i == 0) g.prefill_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // The last token needs no forward: nothing reads its logits.
    if (!o.stop_ids.empty() && stopped.all().item<bool>()) break;
    if (i + 1 < o.new_tokens) logits = model.forward_cached(next.unsqueeze(1), caches);
  }
  g.tokens = at::stack(out, 1);
  g.prompt_tokens = prompt.numel();
  g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& c : caches) g.cache_bytes += c.bytes();
  module.train(was_training);

  if (agree) check_same_tokens(g.tokens, *agree);
  return g;
}

void check_same_tokens(const at::Tensor& tokens, Communicator& comm) {
  if (comm.size() < 2) return;
  // The same tokens everywhere iff their elementwise max and min agree.
  at::Tensor both = at::cat({tokens, -tokens}).contiguous();
  comm.all_reduce(both, ReduceOp::Max);
  const int64_t rows = tokens.size(0);
  if (!both.narrow(0, 0, rows).equal(-both.narrow(0, rows, rows)))
    throw Error("generate: the ranks of '" + comm.name() +
                "' generated different tokens (their logits or sampling streams differ)");
}

int64_t sample_length(const at::Tensor& row, const std::vector<int64_t>& stop_ids, bool* stopped) {
  const at::Tensor t = row.reshape(-1).to(at::kLong).contiguous();
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::find(stop_ids.begin(), stop_ids.end(), p[i]) != stop_ids.end()) {
      *stopped = true;
      return i;
    }
  *stopped = false;
  return t.numel();
}

at::Tensor encode(const std::string& text) {
  at::Tensor t = at::empty({1, static_cast<int64_t>(text.size())}, at::kLong);
  auto a = t.accessor<int64_t, 2>();
  for (size_t i = 0; i < text.size(); ++i) a[0][i] = static_cast<unsigned char>(text[i]);
  return t;
}

std::string decode(const at::Tensor& tokens) {
  const at::Tensor t = tokens.reshape(-1).to(at::kLong).contiguous();
  std::string s;
  for (int64_t i = 0; i < t.numel(); ++i) s += static_cast<char>(t.data_ptr<int64_t>()[i] & 0xff);
  return s;
}

namespace {

// The length of the UTF-8 character at s[i] past ASCII, or 0 where none is:
// as strict as Python's decoder (no overlong forms, no surrogates, nothing
// past U+10FFFF), so the e2e tests' Python prints the same text.
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xc0) != 0x80) return 0;
  if ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) > 0x9f) || (c == 0xf0 && b(1) < 0x90) ||
      (c == 0xf4 && b(1) > 0x8f))
    return 0;
  return n;
}

std::string printable(const std::string& text, bool keep_utf8) {
  std::string s;
  for (size_t i = 0; i < text.size(); ++i) {
    const size_t n = keep_utf8 ? utf8_length(text, i) : 0;
    if (n > 0) {
      s += text.substr(i, n);
      i += n - 1;
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      s += "\\n";
    } else if (c == '\\') {
      s += "\\\\";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      s += buf;
    } else {
      s += static_cast<char>(c);
    }
  }
  return s;
}

}  // namespace

std::string printable(const std::string& text) { return printable(text, false); }
std::string printable_utf8(const std::string& text) { return printable(text, true); }

}  // namespace examples
}  // namespace shardplan
