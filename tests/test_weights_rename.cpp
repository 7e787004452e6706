// WeightsOptions::rename (docs/WEIGHTS.md): std::regex_replace's syntax and
// results, run on RE2. Names come from files: a 300,000-character name
// crashed std::regex_replace (a stack frame per character); every rule is
// now bounded in time and in what it may produce.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <regex>

#include "shardplan/error.h"
#include "shardplan/weights.h"
#include "weights_util.h"

namespace test_weights_rename {

namespace {

using namespace weights_test;

std::string renamed(const std::string& pattern, const std::string& replacement, const std::string& name) {
  shardplan::WeightsOptions o;
  o.rename = {{pattern, replacement}};
  return shardplan::renamed_weight_name(o, name);
}

std::string error_of(const std::vector<std::pair<std::string, std::string>>& rules, const std::string& name) {
  shardplan::WeightsOptions o;
  o.rename = rules;
  try {
    shardplan::renamed_weight_name(o, name);
  } catch (const shardplan::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(WeightRenames, AThreeHundredThousandCharacterNameIsRenamed) {
  const std::string tail(300000, 'a');
  EXPECT_EQ(renamed("^transformer\\.(.*)", "model.$1", "transformer." + tail), "model." + tail);
  EXPECT_EQ(renamed("a+$", "b", "x." + tail), "x.b");
  EXPECT_EQ(renamed("^(x)\\.(a*)$", "$2.$1", "x." + tail), tail + ".x");
}

// Through load_weights, as train_model --rename-weights runs it.
TEST(WeightRenames, ALoadWithAHugeTensorNameNamesIt) {
  const fs::path dir = temp_dir("hugename");
  const auto full = cloned(shardplan::local_state_dict(*gpt(21)));
  shardplan::StateDict file_tensors;
  for (const auto& kv : full) file_tensors.emplace_back("transformer." + kv.first, kv.second);
  const std::string huge = "transformer." + std::string(300000, 'a');
  file_tensors.emplace_back(huge, torch::ones({2}));
  const std::string file = (dir / "w.safetensors").string();
  shardplan::write_safetensors(file, file_tensors);
  auto m = gpt(22);
  shardplan::WeightsOptions o;
  o.rename = {{"^transformer\\.(.*)", "model.$1"}, {"^model\\.(.*)", "$1"}};
  o.strict = false;
  const auto rep = shardplan::load_weights(*m, {}, file, o);
  EXPECT_EQ(rep.unexpected, std::vector<std::string>{huge});
  expect_same(shardplan::local_state_dict(*m), full, "renamed");
  fs::remove_all(dir);
}

TEST(WeightRenames, GroupsAndFormatsAsStdRegexReplace) {
  EXPECT_EQ(renamed("^layers_(\\d+)\\.(\\w+)$", "blocks.$1.mlp.$2", "layers_12.fc1"), "blocks.12.mlp.fc1");
  EXPECT_EQ(renamed("(\\w+)\\.(\\w+)", "$2.$1", "a.b.c.d"), "b.a.d.c");  // every match, left to right
  EXPECT_EQ(renamed("gamma", "[$&]", "ln.gamma"), "ln.[gamma]");
  EXPECT_EQ(renamed("\\.", "$$", "a.b"), "a$b");
  EXPECT_EQ(renamed("b", "<$`|$'>", "abc"), "a<a|c>c");
  EXPECT_EQ(renamed("x", "\\1", "x"), "\\1");  // a backslash is no group
  EXPECT_EQ(renamed("(a)|(b)", "[$2]", "ab"), "[][b]");  // a group that took no part is empty
  // The same on a set of rules, names and formats as std::regex_replace.
  const std::vector<std::pair<std::string, std::string>> rules = {
      {"^transformer\\.", ""},      {"\\.gamma$", ".weight"},       {"h\\.(\\d+)\\.", "blocks.$1."},
      {"_", "."},                   {"(?:ab)+", "<$&>"},            {"[^.]+$", "$&$&"},
      {"\\b(\\w)", "$1$1"},         {"x*", "-"},                    {"(weight|bias)$", "$1_$1"},
      {"^(.*?)\\.(.*)$", "$2.$1"},  {"[[:digit:]]{2,}", "N"},       {"\\s", ""}};
  const std::vector<std::string> names = {"transformer.h.0.ln_1.gamma", "h.12.attn.c_attn.weight", "abab.x",
                                          "", "a b", "x", "fc1.bias", "layers.3.mlp.fc_in.weight"};
  for (const auto& [pattern, format] : rules)
    for (const auto& name : names)
      EXPECT_EQ(renamed(pattern, format, name), std::regex_replace(name, std::regex(pattern), format))
          << pattern << " -> " << format << " on '" << name << "'";
}

TEST(WeightRenames, RefusedRulesAreNamed) {
  EXPECT_EQ(error_of({{"(a)\\1", "b"}}, "aa"),
            "WeightsOptions::rename: '(a)\\1' -> 'b': back-reference \\1 at column 4 of the pattern: back-references "
            "are not supported (no linear-time matcher can run them)");
  EXPECT_EQ(error_of({{"a(?=b)", "c"}}, "ab"),
            "WeightsOptions::rename: 'a(?=b)' -> 'c': lookahead '(?=' at column 2 of the pattern: lookahead is not "
            "supported (no linear-time matcher runs it)");
  EXPECT_EQ(error_of({{"^transformer\\.(.*)", "model.$2"}}, "x"),
            "WeightsOptions::rename: '^transformer\\.(.*)' -> 'model.$2': the replacement 'model.$2' uses $2 but the "
            "pattern has 1 group");
  EXPECT_EQ(error_of({{"fc1.(weight", ""}}, "x"),
            "WeightsOptions::rename: 'fc1.(weight' -> '': unbalanced '(' or ')': the '(' at column 5 of the pattern is "
            "never closed");
  EXPECT_EQ(error_of(std::vector<std::pair<std::string, std::string>>(1001, {"a", "b"}), "x"),
            "WeightsOptions::rename has 1001 rules (at most 1000)");
  // Bounded per name: matches (each may scan the rest of the name) and growth.
  EXPECT_EQ(renamed("a", "b", std::string(256, 'a')), std::string(256, 'b'));
  EXPECT_EQ(error_of({{"a", "b"}}, std::string(257, 'a')),
            "tensor '" + std::string(257, 'a').substr(0, 60) +
                "...' (257 characters): WeightsOptions::rename 'a': it matches more than 256 times in one name");
  EXPECT_NE(error_of({{"^(.*)$", "$1$1$1$1$1"}}, std::string(300000, 'a'))
                .find("WeightsOptions::rename '^(.*)$': the result would be longer than 1048576 bytes"),
            std::string::npos);
  EXPECT_NO_THROW(shardplan::check_rename_rules({{"^transformer\\.", ""}, {"\\.gamma$", ".weight"}}));
  EXPECT_THROW(shardplan::check_rename_rules({{"(a)\\1", ""}}), shardplan::Error);
}

// A quadratic rule (each match looks to the end of the name for a 'y')
// stays within the match bound instead of taking minutes.
TEST(WeightRenames, EveryRuleIsLinearInTheName) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(error_of({{"x(?:.*y)?", "z"}}, std::string(300000, 'x')).find("matches more than 256 times"),
            std::string::npos);
  EXPECT_EQ(renamed("x(?:.*y)?", "z", std::string(200, 'x') + "y"), "z");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

}  // namespace

}  // namespace test_weights_rename
