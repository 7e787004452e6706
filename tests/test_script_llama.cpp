// parallelize_script on a Llama-family TorchScript model (tests/script/
// make_models.py's LlamaForCausalLM: Hugging Face's parameter names, RMSNorm,
// rotary positions, grouped-query attention with 8 query and 4 key/value
// heads, a SwiGLU MLP), sharded on 2 and 4 thread ranks against itself
// unsharded and against the logits Python computed for a probe.
#include "script/script_test_util.h"

namespace test_script_llama {

using namespace shardplan;
using namespace script_test;
// parity.h has a namespace parity that a unity batch may bring in.
using script_test::parity;

namespace {

// Both head counts are divided, so each rank keeps whole key/value heads and
// exactly the query heads that read them (query head h reads kv head h / 2).
const char* kLlamaPlan = R"(
mesh: {model: auto}
divide: {'model\.layers\.\d+\.self_attn': [num_heads, num_key_value_heads]}
rules:
  - {match: 'model\.embed_tokens\.weight', layout: [model, null]}
  - {match: 'model\.layers\.\d+\.self_attn\.(q|k|v)_proj\.weight', layout: [model, null], output: sharded}
  - {match: 'model\.layers\.\d+\.self_attn\.o_proj\.weight', layout: [null, model], input: sharded}
  - {match: 'model\.layers\.\d+\.mlp\.(gate|up)_proj\.weight', layout: [model, null], output: sharded}
  - {match: 'model\.layers\.\d+\.mlp\.down_proj\.weight', layout: [null, model], input: sharded}
  - {match: 'lm_head\.weight', layout: [model, null]}
)";

int64_t attention_attr(const torch::jit::Module& m, const char* name) {
  return m.attr("model").toModule().attr("layers").toModule().attr("1").toModule().attr("self_attn").toModule()
      .attr(name).toInt();
}

// The differences, in the test's XML report (--gtest_output=xml), for
// docs to quote.
void record(const std::string& key, double value) {
  std::ostringstream s;
  s << value;
  ::testing::Test::RecordProperty(key, s.str());
}

const Parity& recorded(const Parity& p) {
  record("outputs", p.outputs);
  record("grads", p.grads);
  record("params", p.params);
  return p;
}

}  // namespace

class ScriptLlama : public ::testing::TestWithParam<int> {};

TEST_P(ScriptLlama, GroupedQueryAttentionSgd) {
  REQUIRE_MODELS();
  expect_parity(recorded(parity("llama.pt", kLlamaPlan, GetParam(), id_inputs(48, 10), false)));
}

TEST_P(ScriptLlama, GroupedQueryAttentionAdam) {
  REQUIRE_MODELS();
  expect_parity(recorded(parity("llama.pt", kLlamaPlan, GetParam(), id_inputs(48, 10), true)));
}

// Python's logits on its probe (llama_io.pt), unsharded and sharded, and
// each rank's share of both head counts.
TEST_P(ScriptLlama, MatchesPythonOutput) {
  REQUIRE_MODELS();
  const int ranks = GetParam();
  const PythonParity p = python_parity("llama.pt", "llama_io.pt", kLlamaPlan, ranks);
  record("unsharded", p.unsharded);
  record("sharded", p.sharded);
  EXPECT_LT(p.unsharded, 1e-10);
  EXPECT_LT(p.sharded, 1e-10);
  const torch::jit::Module original = load(dir, "llama.pt");
  const Plan plan = parse_plan(kLlamaPlan, "llama.yaml");
  std::vector<int64_t> heads(ranks), kv_heads(ranks);
  run_ranks_in_threads(ranks, [&](World& world) {
    ScriptParallel sp = parallelize_script(original, plan, world);
    heads[world.rank()] = attention_attr(*sp.module, "num_heads");
    kv_heads[world.rank()] = attention_attr(*sp.module, "num_key_value_heads");
  });
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(heads[r], 8 / ranks) << "rank " << r;
    EXPECT_EQ(kv_heads[r], 4 / ranks) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ScriptLlama, ::testing::Values(2, 4));

// At 8 ranks every split size divides (8 query heads, 16 key/value rows),
// but 4 key/value heads do not: the divide names the attribute.
TEST(ScriptLlamaErrors, KeyValueHeadsNotDivisible) {
  REQUIRE_MODELS();
  const std::string e = error_of("llama.pt", kLlamaPlan, 8);
  expect_contains(e, {"'num_key_value_heads'", "= 4 is not divisible by 8"});
}

}  // namespace test_script_llama
