// The plan language: parsing (every error at its exact line:col), canonical
// YAML round trips, matching parameters to rules, and mesh resolution.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <regex>

#include "plan_errors.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"

namespace test_plan {

namespace {

namespace fs = std::filesystem;
using namespace shardplan;

using plan_errors::error_of;

// The same message from assign() rather than parse_plan().
std::string assign_error(const std::string& yaml, const std::vector<ParamInfo>& params, int world) {
  const Plan plan = parse_plan(yaml, "p.yaml");
  try {
    plan.assign(params, world);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "<no error>";
}

const std::vector<ParamInfo> kMlp = {
    {"fc1.weight", {16, 8}}, {"fc1.bias", {16}},     {"fc2.weight", {8, 16}},
    {"fc2.bias", {8}},       {"fc3.weight", {4, 8}}, {"fc3.bias", {4}},
};

void expect_same_plan(const Plan& a, const Plan& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.strict, b.strict);
  EXPECT_EQ(a.plugin_dirs, b.plugin_dirs);
  ASSERT_EQ(a.mesh.size(), b.mesh.size());
  for (size_t i = 0; i < a.mesh.size(); ++i) {
    EXPECT_EQ(a.mesh[i].name, b.mesh[i].name);
    EXPECT_EQ(a.mesh[i].size, b.mesh[i].size);
  }
  ASSERT_EQ(a.rules.size(), b.rules.size());
  for (size_t i = 0; i < a.rules.size(); ++i) {
    EXPECT_EQ(a.rules[i].index, b.rules[i].index);
    EXPECT_EQ(a.rules[i].pattern, b.rules[i].pattern);
    EXPECT_EQ(a.rules[i].layout, b.rules[i].layout);
    ASSERT_EQ(a.rules[i].options.size(), b.rules[i].options.size());
    for (const auto& [key, opt] : a.rules[i].options) {
      ASSERT_TRUE(b.rules[i].option(key)) << key;
      EXPECT_EQ(opt.value, b.rules[i].option(key)->value) << key;
    }
  }
}

// ---------------------------------------------------------------------------
// Valid plans

TEST(PlanParse, BasicPlanAndLocations) {
  const Plan plan = parse_plan(R"(version: 1
mesh: {model: auto}
strict: true
rules:
  - match: 'fc1\.weight'
    layout: [model, null]
    output: sharded
  - match: fc2\.weight
    layout: [~, model]
    input: sharded
    blocks: 3
)",
                               "p.yaml");
  EXPECT_EQ(plan.source, "p.yaml");
  EXPECT_EQ(plan.version, 1);
  EXPECT_TRUE(plan.strict);
  ASSERT_EQ(plan.mesh.size(), 1u);
  EXPECT_EQ(plan.mesh[0].name, "model");
  EXPECT_EQ(plan.mesh[0].size, MeshAxisSpec::kAutoSize);
  EXPECT_EQ(plan.mesh_loc.str(), "p.yaml:2:7");
  EXPECT_EQ(plan.mesh[0].loc.str(), "p.yaml:2:8");
  ASSERT_EQ(plan.rules.size(), 2u);

  const Rule& r0 = plan.rules[0];
  EXPECT_EQ(r0.index, 0u);
  EXPECT_EQ(r0.pattern, "fc1\\.weight");
  EXPECT_EQ(r0.layout, (Layout{"model", std::nullopt}));
  EXPECT_EQ(r0.loc.str(), "p.yaml:5:5");
  EXPECT_EQ(r0.pattern_loc.str(), "p.yaml:5:12");
  EXPECT_EQ(r0.layout_loc.str(), "p.yaml:6:13");
  ASSERT_TRUE(r0.option("output"));
  EXPECT_EQ(r0.option("output")->value, "sharded");
  EXPECT_EQ(r0.option("output")->loc.str(), "p.yaml:7:13");
  EXPECT_EQ(r0.option("input"), nullptr);

  const Rule& r1 = plan.rules[1];
  EXPECT_EQ(r1.index, 1u);
  EXPECT_EQ(r1.layout, (Layout{std::nullopt, "model"}));
  EXPECT_EQ(r1.option_or("input", "replicated", {"sharded", "replicated"}), "sharded");
  EXPECT_EQ(r1.option_or("blocks", "1"), "3");
  EXPECT_EQ(r1.option_or("output", "gathered"), "gathered");
}

TEST(PlanParse, NameDescriptionAndEmptyLayout) {
  const Plan plan = parse_plan(R"(name: tiny
description: a scalar parameter and nothing sharded
mesh: {data: 2, model: 2}
rules:
  - {match: scale, layout: []}
)");
  ASSERT_EQ(plan.rules.size(), 1u);
  EXPECT_TRUE(plan.rules[0].layout.empty());
  EXPECT_EQ(plan.mesh.size(), 2u);
  EXPECT_EQ(plan.source, "<string>");
}

TEST(PlanParse, PluginDirsResolveAgainstThePlanFolder) {
  const Plan plan = parse_plan(R"(mesh: {model: 2}
plugins: [../build/plugins, /opt/sp/plugins, ./here/]
rules: []
)",
                               "p.yaml", "/srv/plans/x");
  EXPECT_EQ(plan.plugin_dirs,
            (std::vector<std::string>{"/srv/plans/build/plugins", "/opt/sp/plugins", "/srv/plans/x/here/"}));
}

TEST(PlanParse, StrictFalse) {
  const Plan plan = parse_plan("mesh: {model: 2}\nstrict: false\nrules: []\n");
  EXPECT_FALSE(plan.strict);
}

TEST(PlanParse, LayoutStr) {
  EXPECT_EQ(layout_str({"model", std::nullopt}), "[model, null]");
  EXPECT_EQ(layout_str({}), "[]");
}

TEST(PlanRoundTrip, SeveralPlans) {
  const std::vector<std::string> plans = {
      "mesh: {model: auto}\nrules: []\n",
      R"(version: 1
mesh: {data: 2, model: auto}
plugins: [/abs/one, 'rel dir/two']
strict: false
rules:
  - match: 'layers\.\d+\.attn\.(q|k|v)\.weight'
    layout: [model, null]
    output: gathered
    blocks: 3
    plugin: dense
  - match: "it's \"quoted\" [x]{2}"
    layout: [null, data]
    input: replicated
  - match: '.*'
    layout: []
)",
      // Names and values that YAML would read as something else if written plain.
      "mesh: {'null': 1, 'true': 2, '0': 1}\nrules:\n"
      "  - {match: \"tab\\there\", layout: ['null', 'true', '0', null]}\n"
      "  - {match: 'ünïcode', layout: [~], plugin: '1.5'}\n",
  };
  for (const std::string& text : plans) {
    SCOPED_TRACE(text);
    const Plan a = parse_plan(text, "p.yaml", "/base");
    const std::string yaml = a.to_yaml();
    SCOPED_TRACE(yaml);
    const Plan b = parse_plan(yaml, "round.yaml", "/elsewhere");
    expect_same_plan(a, b);
    EXPECT_EQ(b.to_yaml(), yaml);  // canonical: a fixed point
  }
}

TEST(PlanRoundTrip, CanonicalForm) {
  const Plan plan = parse_plan(R"(rules:
  - layout: [model, null]
    output: sharded
    match: fc1\.weight
mesh:
  model: auto
)");
  EXPECT_EQ(plan.to_yaml(), R"(version: 1
mesh: {model: auto}
strict: true
rules:
  - match: 'fc1\.weight'
    layout: [model, null]
    output: sharded
)");
}

// ---------------------------------------------------------------------------
// Matching

TEST(PlanMatching, FirstMatchWins) {
  const Plan plan = parse_plan(R"(mesh: {model: 2}
rules:
  - {match: 'fc1\.weight', layout: [model, null]}
  - {match: '.*\.weight', layout: [null, model]}
  - {match: 'fc.\.bias', layout: [model]}
)");
  ASSERT_NE(plan.match("fc1.weight"), nullptr);
  EXPECT_EQ(plan.match("fc1.weight")->index, 0u);
  EXPECT_EQ(plan.match("fc2.weight")->index, 1u);
  EXPECT_EQ(plan.match("fc2.bias")->index, 2u);
  EXPECT_EQ(plan.match("fc2.bias.extra"), nullptr);  // full match, not search
  EXPECT_EQ(plan.match("xfc1.weight")->index, 1u);

  const PlanMatch m = plan.assign(kMlp, 2);
  EXPECT_EQ(m.mesh.str(), "{model: 2}");
  ASSERT_EQ(m.params.size(), kMlp.size());
  EXPECT_EQ(m.params[0].path, "fc1.weight");
  EXPECT_EQ(m.params[0].rule, &plan.rules[0]);
  EXPECT_EQ(m.params[0].layout, (Layout{"model", std::nullopt}));
  EXPECT_EQ(m.params[2].rule, &plan.rules[1]);
  EXPECT_EQ(m.params[2].layout, (Layout{std::nullopt, "model"}));
  EXPECT_EQ(m.params[1].rule, &plan.rules[2]);
  EXPECT_EQ(m.params[4].rule, &plan.rules[1]);
  EXPECT_TRUE(m.warnings.empty());
}

TEST(PlanMatching, UnmatchedParamsAreReplicated) {
  const Plan plan =
      parse_plan("mesh: {model: 2}\nrules:\n  - {match: 'fc1\\.weight', layout: [model, null]}\n");
  const PlanMatch m = plan.assign(kMlp, 2);
  EXPECT_EQ(m.params[3].rule, nullptr);
  EXPECT_EQ(m.params[3].layout, (Layout{std::nullopt}));
  EXPECT_EQ(m.params[4].layout, (Layout{std::nullopt, std::nullopt}));
  EXPECT_EQ(m.params[4].shape, (std::vector<int64_t>{4, 8}));
}

TEST(PlanMatching, StrictFalseWarnsAboutUnusedRules) {
  const std::string yaml = R"(mesh: {model: 2}
strict: false
rules:
  - {match: 'fc1\.weight', layout: [model, null]}
  - {match: foo, layout: [model]}
)";
  const PlanMatch m = parse_plan(yaml, "p.yaml").assign(kMlp, 2);
  ASSERT_EQ(m.warnings.size(), 1u);
  EXPECT_EQ(m.warnings[0], "p.yaml:5:5: rule 2 (match: 'foo') matched no parameter");
}

TEST(PlanMatching, AutoMesh) {
  const Plan plan = parse_plan("mesh: {data: 2, model: auto}\nrules: []\n");
  EXPECT_EQ(plan.resolve_mesh(8).str(), "{data: 2, model: 4}");
  EXPECT_EQ(plan.resolve_mesh(2).str(), "{data: 2, model: 1}");
  const Plan one = parse_plan("mesh: {model: auto}\nrules: []\n");
  EXPECT_EQ(one.resolve_mesh(1).str(), "{model: 1}");
  EXPECT_EQ(one.resolve_mesh(7).str(), "{model: 7}");
  EXPECT_THROW(one.resolve_mesh(0), Error);
  const Plan fixed = parse_plan("mesh: {data: 2, model: 2}\nrules: []\n");
  EXPECT_EQ(fixed.resolve_mesh(4).str(), "{data: 2, model: 2}");
}

TEST(PlanMatching, RulesBuiltInCodeMatchToo) {
  Rule rule;
  rule.pattern = "fc\\d\\.weight";
  EXPECT_TRUE(rule.matches("fc1.weight"));
  EXPECT_FALSE(rule.matches("fc1.bias"));
}

// Patterns are translated to RE2's syntax (base/ecma_regex.h): each must
// match exactly what std::regex_match matched, ECMAScript's corners included.
TEST(PlanMatching, FastPathAgreesWithRegex) {
  const std::vector<std::string> patterns = {"fc1\\.weight",
                                             "fc1.weight",
                                             "layers\\.\\d+\\.fc1\\.weight",
                                             ".*\\.bias",
                                             "(fc1|fc2)\\.weight",
                                             "fc[12]\\.weight",
                                             "fc[^1]\\.weight",
                                             "a+b",
                                             "ab?",
                                             "ab{2}c",
                                             "ab{1,}",
                                             "x\\d",
                                             "\\.",
                                             "a\\-b",
                                             "(?:ab)+c",
                                             "[.]x",
                                             "[^\\]]x",
                                             "a*",
                                             "",
                                             "\\\\",
                                             "a\\u0062",
                                             "\\x61b",
                                             "a]",
                                             "a}",
                                             "\\bab",
                                             "fc1\\.weight|fc2\\.bias",
                                             "^fc1$",
                                             "f.c?1",
                                             "ab*?",
                                             "[]a]",
                                             "a\\.+b",
                                             "layers\\.[0-9]+\\.(mlp|attn)\\..*",
                                             "[]",
                                             "[^]",
                                             "a|[]",
                                             "\\W+",
                                             "\\s",
                                             "\\v",
                                             "[\\b]",
                                             "\\0",
                                             "\\a\\z",
                                             "\\Qa",
                                             "[a-c-e]+",
                                             "[-a]b",
                                             "[\\w-]+",
                                             "[[:alpha:]_.]+",
                                             "a+*b",
                                             "a{1,2}{2}"};
  const std::vector<std::string> inputs = {"",
                                           "a",
                                           "ab",
                                           "abb",
                                           "abbc",
                                           "abc",
                                           "aab",
                                           "b",
                                           "x1",
                                           "xa",
                                           ".",
                                           "a-b",
                                           "abc",
                                           "ababc",
                                           ".x",
                                           "xx",
                                           "]x",
                                           "\\",
                                           "a]",
                                           "a}",
                                           "fc1.weight",
                                           "fc1xweight",
                                           "fc2.weight",
                                           "fc3.weight",
                                           "fc2.bias",
                                           "fc1.bias",
                                           "layers.12.fc1.weight",
                                           "layers..fc1.weight",
                                           "layers.3.mlp.fc1.weight",
                                           "layers.3.attn.q",
                                           "fc1",
                                           "fac1",
                                           "fc",
                                           "aa",
                                           "a..b",
                                           "a.b",
                                           "ab.weight",
                                           "x.bias",
                                           "\v",
                                           "\b",
                                           "a\n",
                                           "\r",
                                           " ",
                                           std::string(1, '\0'),
                                           "\xe9",
                                           "az",
                                           "Qa",
                                           "aab",
                                           "c-e",
                                           "-ab",
                                           "a_b.c",
                                           "w-w"};
  for (const std::string& p : patterns) {
    Rule rule;
    rule.pattern = p;
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : inputs)
      EXPECT_EQ(rule.matches(s), std::regex_match(s, re)) << "pattern '" << p << "' input '" << s << "'";
  }
}

// Random patterns from ECMAScript's constructs: what std::regex accepts
// compiles and matches the same names; what it refuses is a plan error.
TEST(PlanMatching, GeneratedPatternsAgreeWithStdRegex) {
  const std::vector<std::string> atoms = {
      "a",    "b",    ".",     "\\.",   "\\d",   "\\w",     "\\s",  "\\W",  "[ab]", "[^a]",  "[a-c]",  "[]",
      "[^]",  "(",    ")",     "(?:",   "|",     "*",       "+",    "?",    "{2}",  "{1,}",  "{0,2}",  "*?",
      "^",    "$",    "\\b",   "\\B",   "[-a]",  "[a-]",    "[\\]]", "]",    "}",    "\\-",   "\\x61",  "1",
      "[.]",  "_",    "{",     "[a-]b", "\\n",   "[[:digit:]]"};
  const std::string chars = "ab1._-\n]x ";
  std::mt19937 rng(33);
  int compared = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string p;
    for (int k = static_cast<int>(rng() % 6) + 1; k > 0; --k) p += atoms[rng() % atoms.size()];
    std::optional<std::regex> want;
    try {
      want.emplace(p, std::regex::ECMAScript);
    } catch (const std::regex_error&) {
    }
    Rule rule;
    rule.pattern = p;
    if (!want) {
      EXPECT_THROW(rule.matches(""), PlanError) << "pattern '" << p << "'";
      continue;
    }
    for (int t = 0; t < 10; ++t) {
      std::string s;
      for (int k = static_cast<int>(rng() % 6); k > 0; --k) s += chars[rng() % chars.size()];
      EXPECT_EQ(rule.matches(s), std::regex_match(s, *want)) << "pattern '" << p << "' input '" << s << "'";
      ++compared;
    }
  }
  EXPECT_GT(compared, 10000);
}

// Speed is measured in benchmarks/framework (bench_framework), not here: this
// checks first-match-wins over a large, realistic parameter set.
TEST(PlanMatching, TenThousandParams) {
  std::string yaml = "mesh: {model: auto}\nstrict: false\nrules:\n";
  for (const char* name : {"q", "k", "v", "o"})
    yaml +=
        std::string("  - {match: 'layers\\.\\d+\\.attn\\.") + name + "\\.weight', layout: [model, null]}\n";
  yaml += "  - {match: 'layers\\.\\d+\\.mlp\\.fc1\\.(weight|bias)', layout: [model, null]}\n";
  yaml += "  - {match: 'layers\\.\\d+\\.mlp\\.fc2\\.weight', layout: [null, model]}\n";
  yaml += "  - {match: 'embed\\.weight', layout: [model, null]}\n";
  yaml += "  - {match: '.*\\.norm\\.weight', layout: [null]}\n";
  const Plan plan = parse_plan(yaml);
  std::vector<ParamInfo> params;
  for (int layer = 0; params.size() < 10000; ++layer) {
    const std::string l = "layers." + std::to_string(layer) + ".";
    for (const char* n : {"attn.q.weight", "attn.k.weight", "attn.v.weight", "attn.o.weight", "attn.o.bias",
                          "mlp.fc2.weight", "mlp.fc2.bias", "norm.weight", "norm.bias", "mlp.fc1.weight"})
      params.push_back({l + n, std::string(n).find("weight") != std::string::npos &&
                                       std::string(n).find("norm") == std::string::npos
                                   ? std::vector<int64_t>{64, 64}
                                   : std::vector<int64_t>{64}});
  }
  params.resize(10000);
  params.back().shape = {64};
  params.back().path = "final.norm.weight";
  const PlanMatch m = plan.assign(params, 4);
  EXPECT_EQ(m.params[0].rule, &plan.rules[0]);
  EXPECT_EQ(m.params[4].rule, nullptr);  // attn.o.bias
  EXPECT_EQ(m.params[7].rule, &plan.rules[7]);
  EXPECT_EQ(m.params[9999].rule, &plan.rules[7]);  // final.norm.weight
  ASSERT_EQ(m.params.size(), 10000u);
}

// ---------------------------------------------------------------------------
// Errors: each at the exact line:col of the offending node

TEST(PlanErrors, YamlSyntax) {
  EXPECT_PLAN_ERROR("mesh: {model: auto}\nrules:\n  - match: \"a\\q\"\n    layout: []\n", 3, 16,
                    "invalid YAML: unknown escape character: q");
  EXPECT_PLAN_ERROR("mesh: {model: auto}\nrules:\n  - match: a\n\tlayout: [model]\n", 4, 1, "invalid YAML");
}

TEST(PlanErrors, EmptyOrNotAMap) {
  EXPECT_PLAN_ERROR("", 1, 1, "the plan is empty");
  EXPECT_PLAN_ERROR("# only a comment\n", 1, 1, "the plan is empty");
  EXPECT_PLAN_ERROR("\n- mesh\n", 2, 1, "a plan must be a map with mesh and rules, got a list");
}

TEST(PlanErrors, UnknownTopLevelKey) {
  EXPECT_PLAN_ERROR("mesh: {model: auto}\nrule: []\n", 2, 1,
                    "unknown key 'rule' (expected version, mesh, plugins, strict, paths, batch_axis, data_parallel, sequence_parallel, divide, recompute, pipeline, rules, name, description)");
}

TEST(PlanErrors, DuplicateKey) {
  EXPECT_PLAN_ERROR("mesh: {model: auto}\nrules: []\nmesh: {model: 2}\n", 3, 1, "duplicate key 'mesh'");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: a, layout: [], match: b}\n", 3, 28,
                    "duplicate key 'match' in rule");
}

TEST(PlanErrors, UnknownRuleKey) {
  EXPECT_PLAN_ERROR(R"(mesh: {model: auto}
rules:
  - match: a
    layout: [model]
    outptu: sharded
)",
                    5, 5,
                    "unknown key 'outptu' in rule (expected match, layout, output, input, blocks, plugin, sequence_parallel, sequence_dim, overlap, head_dim, replicate_heads)");
}

TEST(PlanErrors, MissingMeshOrRules) {
  EXPECT_PLAN_ERROR("rules: []\n", 1, 1, "missing 'mesh'");
  EXPECT_PLAN_ERROR("# a plan\n\nrules: []\n", 3, 1, "missing 'mesh'");
  EXPECT_PLAN_ERROR("version: 1\nmesh: {model: 2}\n", 1, 1, "missing 'rules'");
}

TEST(PlanErrors, MissingMatchOrLayout) {
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: a}\n  - layout: []\n", 3, 5,
                    "rule 1 has no 'layout'");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: a, layout: [model]}\n  - layout: []\n", 4, 5,
                    "rule 2 has no 'match'");
}

TEST(PlanErrors, MeshNotAMap) {
  EXPECT_PLAN_ERROR("mesh: [model]\nrules: []\n", 1, 7, "mesh must be a map of axis name to size");
  EXPECT_PLAN_ERROR("mesh:\nrules: []\n", 1, 1, "mesh must be a map of axis name to size");
  EXPECT_PLAN_ERROR("mesh: {}\nrules: []\n", 1, 7, "mesh must name at least one axis");
}

TEST(PlanErrors, MeshAxisSize) {
  const char* expected = "mesh axis 'model' must have an integer size >= 1 or auto";
  EXPECT_PLAN_ERROR("mesh: {model: 0}\nrules: []\n", 1, 15, expected);
  EXPECT_PLAN_ERROR("mesh: {model: two}\nrules: []\n", 1, 15, "got 'two'");
  EXPECT_PLAN_ERROR("mesh: {model: 2.5}\nrules: []\n", 1, 15, expected);
  EXPECT_PLAN_ERROR("mesh: {model: -2}\nrules: []\n", 1, 15, expected);
  EXPECT_PLAN_ERROR("mesh: {model: 99999999999}\nrules: []\n", 1, 15, expected);
  EXPECT_PLAN_ERROR("mesh:\n  data: 2\n  model: [2]\nrules: []\n", 3, 10, "got a list");
  EXPECT_PLAN_ERROR("mesh:\n  data: 2\n  model:\nrules: []\n", 3, 3, "got nothing");
}

TEST(PlanErrors, TwoAutoAxes) {
  EXPECT_PLAN_ERROR("mesh: {data: auto, model: auto}\nrules: []\n", 1, 27,
                    "axis 'model' is auto but 'data' already is; at most one mesh axis can be auto");
}

TEST(PlanErrors, DuplicateAxis) {
  EXPECT_PLAN_ERROR("mesh: {model: 2, model: 2}\nrules: []\n", 1, 18, "duplicate axis 'model' in mesh");
}

TEST(PlanErrors, UnknownAxisInLayout) {
  EXPECT_PLAN_ERROR(R"(mesh: {model: auto}
rules:
  - match: a
    layout: [modle, null]
)",
                    4, 14, "unknown axis 'modle' in layout; mesh axes are: model");
  EXPECT_PLAN_ERROR("mesh: {data: 2, model: 2}\nrules:\n  - {match: a, layout: [null, 'null']}\n", 3, 31,
                    "unknown axis 'null' in layout; mesh axes are: data, model");
}

TEST(PlanErrors, AxisTwiceInLayout) {
  EXPECT_PLAN_ERROR(R"(mesh: {model: auto}
rules:
  - match: a
    layout: [model, model]
)",
                    4, 21, "axis 'model' appears twice in layout");
}

TEST(PlanErrors, LayoutNotASequence) {
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - match: a\n    layout: model\n", 4, 13,
                    "layout must be a list with a mesh axis or null per tensor dim");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - match: a\n    layout:\n", 4, 5, "got nothing");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - match: a\n    layout: [[model]]\n", 4, 14,
                    "layout entries must be a mesh axis name or null, got a list");
}

TEST(PlanErrors, InvalidRegex) {
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - match: 'fc1\\.(weight'\n    layout: [model]\n", 3, 12,
                    "invalid regex 'fc1\\.(weight': unbalanced '(' or ')'");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {layout: [], match: '*.weight'}\n", 3, 25,
                    "invalid regex '*.weight': '*' at the start has nothing to repeat");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: '[b-a]', layout: []}\n", 3, 13,
                    "invalid character range");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: [a], layout: []}\n", 3, 13,
                    "match must be a regex string, got a list");
  // Found by the fuzzer: libstdc++ overflows reading a count this long.
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: 'a{9999999999999999999}', layout: []}\n", 3, 13,
                    "repetition count 9999999999999999999 is too large (at most 1000)");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: 'blocks\\.\\d{2,5000}', layout: []}\n", 3, 13,
                    "repetition count 5000 is too large");
  // Back-references and lookahead (no linear-time engine runs them), and
  // what RE2 would read otherwise, each with its column in the pattern.
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"(a)\\99999999999999999999",
       "back-reference \\99999999999999999999 at column 4 of the pattern: back-references are not supported"},
      {"(.*)*\\1x",
       "invalid regex '(.*)*\\1x': back-reference \\1 at column 6 of the pattern: back-references are not supported "
       "(no linear-time matcher can run them)"},
      {"blocks\\.\\d+\\.(?=attn)\\w+",
       "invalid regex 'blocks\\.\\d+\\.(?=attn)\\w+': lookahead '(?=' at column 14 of the pattern: lookahead is not "
       "supported"},
      {".*(?!bias)", "lookahead '(?!' at column 3 of the pattern"},
      {"(?<name>a)", "'(?' at column 1 of the pattern is neither a group '(?:' nor a lookahead"},
      {"a{,3}", "invalid {m,n} repetition at column 2 of the pattern"},
      {"a\\cJ", "control escape \\c at column 2 of the pattern is not supported"},
      {"\\u0100", "\\u0100 at column 1 of the pattern is above \\u00ff"},
      {"[[.a.]]", "collating element or equivalence class '[.' at column 2 of the pattern is not supported"},
      {"(?:a{100}){11}", "repetition counts nested in each other multiply to more than 1000"}};
  for (const auto& [pattern, text] : refused)
    EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: '" + pattern + "', layout: []}\n", 3, 13, text);
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - match: 'fc\\d(?=\\.)'\n    layout: []\n", 3, 12,
                    "lookahead '(?=' at column 5 of the pattern");
  // The same refusals in the other places a plan holds patterns.
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules: []\ndata_parallel: {ignore: ['(a)\\1']}\n", 3, 26,
                    "back-reference \\1 at column 4 of the pattern");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules: []\ndivide:\n  'a(?=b)': [n_head]\n", 4, 3,
                    "lookahead '(?=' at column 2 of the pattern");
  // Found by the fuzzer: nested repetitions took libstdc++'s backtracking
  // executor 2^n steps on a near miss of n characters (here ~10^18: a hang,
  // which ctest's timeout would report); the automaton executor answers at once.
  {
    const auto plan =
        shardplan::parse_plan("mesh: {model: 2}\nrules:\n  - {match: '(a+)+b|fc+++++*+++d+++1\\.weight', layout: []}\n");
    EXPECT_EQ(plan.match(std::string(60, 'a')), nullptr);
    EXPECT_EQ(plan.match(std::string(60, 'a') + "b"), &plan.rules[0]);
    EXPECT_EQ(plan.match("fccccd1.weight"), &plan.rules[0]);
    EXPECT_EQ(plan.match("fccccd1.weights"), nullptr);
  }
  // Braces that hold no count are left alone: escaped, or in a set.
  EXPECT_NO_THROW(shardplan::parse_plan("mesh: {model: 2}\nrules:\n  - {match: 'a\\{99999\\}|[{9999999}]|b{1000}', "
                                        "layout: []}\n"));
}

TEST(PlanErrors, RuleOptions) {
  const std::string head = "mesh: {model: 2}\nrules:\n  - match: a\n    layout: [model]\n";
  EXPECT_PLAN_ERROR(head + "    output: both\n", 5, 13, "output must be sharded or gathered, got 'both'");
  EXPECT_PLAN_ERROR(head + "    input: gathered\n", 5, 12,
                    "input must be sharded or replicated, got 'gathered'");
  EXPECT_PLAN_ERROR(head + "    blocks: 0\n", 5, 13, "blocks must be an integer >= 1, got '0'");
  EXPECT_PLAN_ERROR(head + "    blocks: three\n", 5, 13, "blocks must be an integer >= 1");
  EXPECT_PLAN_ERROR(head + "    plugin: [dense]\n", 5, 13,
                    "plugin must be a plugin name (letters, digits, '_', '-', '.'), e.g. dense, got a list");
  EXPECT_PLAN_ERROR(head + "    plugin:\n", 5, 5, "plugin must be a plugin name");
}

// Which libraries get loaded is the user's choice (PluginLoader), so a plan
// names a plugin and never points at a file.
TEST(PlanErrors, PluginOptionIsANameNeverAPath) {
  const std::string head = "mesh: {model: 2}\nrules:\n  - match: a\n    layout: [model]\n";
  for (const std::string path :
       {"./libshardplan_layer_x.so", "/opt/lib/libshardplan_layer_x.so", "../x", "sub/x", ".x"})
    EXPECT_PLAN_ERROR(head + "    plugin: '" + path + "'\n", 5, 13,
                      "plugin must be a plugin name (letters, digits, '_', '-', '.'), e.g. dense, got '" + path + "'");
  EXPECT_EQ(parse_plan(head + "    plugin: cross_entropy-v2.1\n").rules[0].option("plugin")->value,
            "cross_entropy-v2.1");
}

// libstdc++ compiled a regex by recursion, one chain of frames per nested
// group and per term: tens of thousands of either overflowed the stack of
// every tool that loaded the plan (a crash, not an error). RE2 recurses on
// neither; what is left is the length limit, which bounds a pattern's memory.
TEST(PlanErrors, RegexTooDeepOrTooLong) {
  const std::string head = "mesh: {model: 2}\nrules:\n  - {match: '";
  const std::string tail = "', layout: []}\n";
  const std::string deeper = std::string(30000, '(') + "a" + std::string(30000, ')');
  EXPECT_PLAN_ERROR(head + deeper + tail, 3, 13,
                    "invalid regex '" + std::string(60, '(') +
                        "...' (60001 characters): the pattern is 60001 characters long (at most 4096)");
  EXPECT_LT(error_of(head + deeper + tail).size(), 300u);  // the pattern is quoted shortened
  EXPECT_PLAN_ERROR(head + std::string(100000, 'a') + tail, 3, 13,
                    "the pattern is 100000 characters long (at most 4096)");
  // Up to the limit, patterns compile and match, however deep; parentheses
  // inside a set or escaped are no groups.
  const Plan deep = parse_plan(head + std::string(2000, '(') + "a" + std::string(2000, ')') + tail);
  EXPECT_EQ(deep.match("a"), &deep.rules[0]);
  EXPECT_EQ(deep.match("aa"), nullptr);
  std::string nested = std::string(100, '(') + "fc" + std::string(100, ')') + "\\.[(]*\\(?weight";
  for (int i = 0; i < 900; ++i) nested += "(x?)";  // 3800 characters
  const Plan plan = parse_plan(head + nested + tail);
  EXPECT_EQ(plan.match("fc.weight"), &plan.rules[0]);
  EXPECT_EQ(plan.match("fc.(weight"), &plan.rules[0]);
  EXPECT_EQ(plan.match("fd.weight"), nullptr);
  // A pattern whose compiled form is too large is refused, not built.
  std::string big;
  for (int i = 0; i < 300; ++i) big += "[a-z]{1000}";
  EXPECT_PLAN_ERROR(head + big + tail, 3, 13, "the compiled pattern is too large");
}

// A plan's memory is some 50 to 150 times its text (yaml-cpp's tree, a
// compiled pattern per rule): hundreds of thousands of rules ended in
// std::bad_alloc naming nothing. Plans past the limits are refused first.
TEST(PlanErrors, HugePlansAreRefusedBeforeTheyExhaustMemory) {
  std::string many = "mesh: {model: auto}\nstrict: false\nrules:\n";
  for (size_t i = 0; i < kMaxPlanRules; ++i) many += "- {match: a, layout: []}\n";
  EXPECT_EQ(parse_plan(many).rules.size(), kMaxPlanRules);
  many += "- {match: b, layout: []}\n";
  EXPECT_PLAN_ERROR(many, 4 + kMaxPlanRules, 3, "more than 10000 rules; a plan may have at most that many");

  const std::string big = "mesh: {model: auto}\nrules: []\ndescription: '" + std::string(kMaxPlanBytes, 'x') + "'\n";
  const std::string size = std::to_string(big.size());
  EXPECT_EQ(error_of(big), "p.yaml: the plan is " + size + " bytes; a plan may have at most 1048576 (1 MiB)");
  // A file is measured before it is read.
  const fs::path file = fs::temp_directory_path() / ("shardplan_big_plan_" + std::to_string(::getpid()) + ".yaml");
  std::ofstream(file) << big;
  try {
    load_plan(file.string());
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_EQ(std::string(e.what()), file.string() + ": the plan is " + size + " bytes; a plan may have at most " +
                                         "1048576 (1 MiB)");
  }
  fs::remove(file);
}

// As in checkpoint metadata: text that is not UTF-8 would come back altered
// from the canonical form, so it is refused where it is written.
TEST(PlanErrors, TextThatIsNotUtf8) {
  const std::string bad = "\xff";
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: 'fc" + bad + "', layout: []}\n", 3, 13,
                    "match is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {mod" + bad + "el: 2}\nrules: []\n", 1, 8, "a mesh axis name is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules: []\nna" + bad + "me: x\n", 3, 1, "a key is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules: []\ndescription: caf\xc3\n", 3, 14,
                    "description is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nplugins: [/opt/" + bad + "]\nrules: []\n", 2, 11,
                    "a plugin directory is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: a, layout: [m" + bad + "]}\n", 3, 25,
                    "a layout entry is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: a, layout: [], plugin: d" + bad + "}\n", 3, 36,
                    "plugin is not valid UTF-8");
  // Overlong forms and surrogates are not UTF-8 either.
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: '\xc0\xae', layout: []}\n", 3, 13,
                    "match is not valid UTF-8");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - {match: '\xed\xa0\x80', layout: []}\n", 3, 13,
                    "match is not valid UTF-8");
  // UTF-8 itself is fine, and survives the canonical form.
  const Plan plan = parse_plan(
      "mesh: {mod\xc3\xa8le: 2}\ndescription: caf\xc3\xa9\nrules:\n  - {match: 'blocks\\.\xc3\xa9', "
      "layout: [mod\xc3\xa8le]}\n");
  EXPECT_EQ(plan.match("blocks.\xc3\xa9"), &plan.rules[0]);
  EXPECT_EQ(parse_plan(plan.to_yaml()).to_yaml(), plan.to_yaml());
}

// plan_fuzzer's finding: a data_parallel.ignore pattern holding a control
// character (here NUL and 0x01) was written single-quoted, which YAML cannot
// hold, so the canonical form did not parse back.
TEST(PlanCanonical, IgnorePatternsWithControlCharactersRoundTrip) {
  const Plan plan = parse_plan(
      "version: 1\nmesh: {data: 2, model: auto}\ndata_parallel: {ignore: [\"a\\x00b\", \"c\\x01'd\"], "
      "bucket_mb: 0.5, zero: true, reduce_dtype: bfloat16}\nrules: []\n");
  ASSERT_EQ(plan.data_parallel.ignore.size(), 2u);
  EXPECT_EQ(plan.data_parallel.ignore[0].pattern, std::string("a\0b", 3));
  const Plan again = parse_plan(plan.to_yaml(), "canonical.yaml");
  EXPECT_EQ(again.to_yaml(), plan.to_yaml());
  ASSERT_EQ(again.data_parallel.ignore.size(), 2u);
  EXPECT_EQ(again.data_parallel.ignore[0].pattern, std::string("a\0b", 3));
  EXPECT_EQ(again.data_parallel.ignore[1].pattern, "c\x01'd");
  EXPECT_EQ(again.data_parallel.bucket_mb, "0.5");
  EXPECT_TRUE(again.data_parallel.zero);
  EXPECT_EQ(again.data_parallel.reduce_dtype, "bfloat16");
}

TEST(PlanErrors, OptionOrRejectsValuesOutsideAllowed) {
  const Plan plan =
      parse_plan("mesh: {model: 2}\nrules:\n  - {match: a, layout: [model], plugin: dense}\n", "p.yaml");
  try {
    plan.rules[0].option_or("plugin", "", {"sparse"});
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_EQ(std::string(e.what()), "p.yaml:3:41: plugin must be one of sparse, got 'dense'");
  }
}

TEST(PlanErrors, OtherTopLevelValues) {
  EXPECT_PLAN_ERROR("version: 2\nmesh: {model: 2}\nrules: []\n", 1, 10, "unsupported version '2'");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nstrict: maybe\nrules: []\n", 2, 9, "strict must be true or false");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nplugins: ../lib\nrules: []\n", 2, 10,
                    "plugins must be a list of directories");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nname: [a]\nrules: []\n", 2, 7, "name must be text");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules: {match: a}\n", 2, 8, "rules must be a list");
  EXPECT_PLAN_ERROR("mesh: {model: 2}\nrules:\n  - fc1\n", 3, 5,
                    "rule 1 must be a map with match and layout, got a scalar");
}

TEST(PlanErrors, MeshDoesNotFitTheWorld) {
  EXPECT_EQ(assign_error("mesh: {model: 3}\nrules: []\n", kMlp, 2),
            "p.yaml:1:7: mesh {model: 3} has 3 ranks but the world has 2 ranks");
  EXPECT_EQ(
      assign_error("# comment\nmesh:\n  data: 4\n  model: auto\nrules: []\n", kMlp, 6),
      "p.yaml:3:3: mesh {data: 4, model: auto} needs a world size divisible by 4 but the world has 6 ranks");
}

TEST(PlanErrors, LayoutRankDiffersFromTensorRank) {
  EXPECT_EQ(
      assign_error("mesh: {model: 2}\nrules:\n  - match: 'fc1\\..*'\n    layout: [model, null]\n", kMlp, 2),
      "p.yaml:4:13: layout [model, null] has 2 dims but parameter 'fc1.bias' has 1 dim (shape [16])");
}

TEST(PlanErrors, RuleMatchedNothing) {
  EXPECT_EQ(assign_error("mesh: {model: 2}\nrules:\n  - {match: 'fc1\\.weight', layout: [model, null]}\n"
                         "  - match: foo\n    layout: [model]\n",
                         kMlp, 2),
            "p.yaml:4:5: rule 2 (match: 'foo') matched no parameter");
}

// ---------------------------------------------------------------------------
// Files

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("shardplan_plan_test_" + std::to_string(::getpid()));
    fs::create_directories(path / "plans");
  }
  ~TempDir() { fs::remove_all(path); }
};

TEST(PlanLoad, FileNotFoundNamesThePath) {
  try {
    load_plan("/no/such/plan.yaml");
    FAIL();
  } catch (const PlanError&) {
    FAIL() << "a missing file is not a PlanError";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/no/such/plan.yaml"), std::string::npos) << e.what();
  }
}

TEST(PlanLoad, ErrorsNameTheFileAndPluginDirsAreRelativeToIt) {
  TempDir tmp;
  const fs::path file = tmp.path / "plans" / "p.yaml";
  std::ofstream(file) << "mesh: {model: auto}\nplugins: [../lib]\nrules:\n  - {match: a, layout: [modle]}\n";
  try {
    load_plan(file.string());
    FAIL();
  } catch (const PlanError& e) {
    EXPECT_EQ(e.loc().file, file.string());
    EXPECT_EQ(e.loc().line, 4);
    EXPECT_EQ(e.loc().col, 25);
    EXPECT_EQ(std::string(e.what()), file.string() + ":4:25: " + e.message());
  }
  std::ofstream(file) << "mesh: {model: auto}\nplugins: [../lib]\nrules: []\n";
  const Plan plan = load_plan(file.string());
  EXPECT_EQ(plan.source, file.string());
  EXPECT_EQ(plan.plugin_dirs, (std::vector<std::string>{(tmp.path / "lib").string()}));
}

TEST(PlanLoad, ExampleMlpPlan) {
  const Plan plan = load_plan(SHARDPLAN_SOURCE_DIR "/plans/mlp.yaml");
  const PlanMatch m = plan.assign(kMlp, 2);
  EXPECT_EQ(m.mesh.str(), "{model: 2}");
  EXPECT_EQ(m.params[0].layout, (Layout{"model", std::nullopt}));  // fc1.weight
  EXPECT_EQ(m.params[1].layout, (Layout{"model"}));                // fc1.bias
  EXPECT_EQ(m.params[2].layout, (Layout{std::nullopt, "model"}));  // fc2.weight
  for (size_t i = 3; i < kMlp.size(); ++i) {
    EXPECT_EQ(m.params[i].rule, nullptr) << kMlp[i].path;
  }
  EXPECT_EQ(m.params[0].rule->option_or("output", ""), "sharded");
  EXPECT_EQ(m.params[2].rule->option_or("input", ""), "sharded");
}

TEST(PlanErrorType, SourceLocAndWhat) {
  EXPECT_EQ((SourceLoc{"a.yaml", 3, 7}).str(), "a.yaml:3:7");
  EXPECT_EQ((SourceLoc{"a.yaml", 0, 0}).str(), "a.yaml");
  const PlanError e(SourceLoc{"a.yaml", 3, 7}, "bad");
  EXPECT_EQ(std::string(e.what()), "a.yaml:3:7: bad");
  EXPECT_EQ(e.message(), "bad");
  EXPECT_EQ(e.loc().line, 3);
}

}  // namespace

}  // namespace test_plan
