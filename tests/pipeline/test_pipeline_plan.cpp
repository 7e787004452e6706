// The plan's `pipeline:` key: parsing, the canonical form's round trip, and
// each bad input as one line at its file:line:col.
#include <gtest/gtest.h>

#include <string>

#include "../plan_errors.h"
#include "shardplan/error.h"
#include "shardplan/plan.h"

namespace test_pipeline_plan {

namespace {

using namespace shardplan;

using plan_errors::error_of;

std::string plan_with(const std::string& pipeline, const std::string& mesh = "{pipe: 2}") {
  return "version: 1\nmesh: " + mesh + "\npipeline: " + pipeline + "\nrules: []\n";
}

}  // namespace

TEST(PipelinePlan, ParsesEveryKey) {
  const Plan plan = parse_plan(plan_with("{axis: pp, schedule: interleaved, micro_batches: 8, virtual_stages: 2, "
                                         "stages: [['a|b'], ['c'], ['d\\.\\d+'], ['e']]}",
                                         "{data: 2, pp: 2}"),
                               "p.yaml");
  const PipelineSpec& p = plan.pipeline;
  ASSERT_TRUE(p.enabled);
  EXPECT_EQ(p.axis, "pp");
  EXPECT_EQ(p.schedule, "interleaved");
  EXPECT_EQ(p.micro_batches, 8);
  EXPECT_EQ(p.virtual_stages, 2);
  ASSERT_EQ(p.stages.size(), 4u);
  EXPECT_TRUE(p.stages[0][0].matches("b"));
  EXPECT_FALSE(p.stages[0][0].matches("ab"));
  EXPECT_TRUE(p.stages[2][0].matches("d.12"));
  EXPECT_EQ(p.stages[2][0].loc.line, 3);
}

TEST(PipelinePlan, DefaultsAndAbsence) {
  EXPECT_FALSE(parse_plan("version: 1\nmesh: {model: 2}\nrules: []\n", "p.yaml").pipeline.enabled);
  const Plan plan = parse_plan(plan_with("{micro_batches: 4}"), "p.yaml");
  EXPECT_EQ(plan.pipeline.axis, "pipe");
  EXPECT_EQ(plan.pipeline.schedule, "1f1b");
  EXPECT_EQ(plan.pipeline.virtual_stages, 1);
  EXPECT_TRUE(plan.pipeline.stages.empty());  // auto
}

TEST(PipelinePlan, CanonicalFormRoundTrips) {
  for (const std::string& text :
       {plan_with("{micro_batches: 4}"), plan_with("{schedule: gpipe, micro_batches: 3, stages: auto}"),
        plan_with("{schedule: interleaved, micro_batches: 4, virtual_stages: 2}"),
        plan_with("{micro_batches: 2, stages: [['tok_emb|pos_emb', 'blocks\\.0'], ['blocks\\.1', 'ln_f|head']]}")}) {
    SCOPED_TRACE(text);
    const Plan a = parse_plan(text, "p.yaml");
    const std::string y = a.to_yaml();
    const Plan b = parse_plan(y, "p.yaml");
    EXPECT_EQ(b.to_yaml(), y);
    EXPECT_EQ(b.pipeline.schedule, a.pipeline.schedule);
    EXPECT_EQ(b.pipeline.micro_batches, a.pipeline.micro_batches);
    EXPECT_EQ(b.pipeline.virtual_stages, a.pipeline.virtual_stages);
    ASSERT_EQ(b.pipeline.stages.size(), a.pipeline.stages.size());
    for (size_t s = 0; s < a.pipeline.stages.size(); ++s) {
      ASSERT_EQ(b.pipeline.stages[s].size(), a.pipeline.stages[s].size());
      for (size_t i = 0; i < a.pipeline.stages[s].size(); ++i)
        EXPECT_EQ(b.pipeline.stages[s][i].pattern, a.pipeline.stages[s][i].pattern);
    }
  }
}

TEST(PipelinePlan, BadInputIsOneLineAtItsPlace) {
  // pipeline: starts at column 11 of line 3.
  EXPECT_PLAN_ERROR(plan_with("{schedule: 1fb1, micro_batches: 4}"), 3, 22, "did you mean '1f1b'?");
  EXPECT_PLAN_ERROR(plan_with("{schedule: gpipe2, micro_batches: 4}"), 3, 22, "schedules: gpipe, 1f1b, interleaved");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 0}"), 3, 27, "micro_batches must be a positive integer");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: two}"), 3, 27, "micro_batches must be a positive integer");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: -3}"), 3, 27, "micro_batches must be a positive integer");
  EXPECT_PLAN_ERROR(plan_with("{schedule: gpipe}"), 3, 11, "pipeline needs micro_batches");
  EXPECT_PLAN_ERROR(plan_with("{axis: stage, micro_batches: 4}"), 3, 18, "pipeline.axis 'stage' is not a mesh axis");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, virtual_stages: 2}"), 3, 46, "virtual_stages needs schedule: interleaved");
  EXPECT_PLAN_ERROR(plan_with("{schedule: interleaved, micro_batches: 4}"), 3, 22, "needs virtual_stages");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, stage: auto}"), 3, 30, "unknown key 'stage' in pipeline");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, stages: [a, b]}"), 3, 39, "one list of module path patterns per stage");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, stages: [[a], [b], [c]]}"), 3, 38, "lists 3 stages");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, stages: [[a], [a]]}"), 3, 45, "'a' is given twice");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 4, stages: [['a('], [b]]}"), 3, 40, "");
  EXPECT_PLAN_ERROR(plan_with("{micro_batches: 1}"), 3, 27, "1f1b needs at least as many micro_batches as stages (2)");
  EXPECT_PLAN_ERROR(plan_with("{schedule: interleaved, virtual_stages: 2, micro_batches: 3}"), 3, 69,
                    "micro_batches divisible by the stages (2)");
  EXPECT_PLAN_ERROR(plan_with("pipe"), 3, 11, "pipeline must be a map");
  // The pipeline's axis is neither the batch axis nor split by a rule.
  EXPECT_PLAN_ERROR(plan_with("{axis: data, micro_batches: 4}", "{data: 2}"), 3, 18, "also the batch axis");
  EXPECT_PLAN_ERROR("version: 1\nmesh: {pipe: 2, model: 2}\npipeline: {micro_batches: 4}\n"
                    "sequence_parallel: {dim: 0, axis: pipe}\nrules: []\n",
                    4, 35, "sequence_parallel.axis 'pipe' is the pipeline's axis");
  EXPECT_PLAN_ERROR("version: 1\nmesh: {pipe: 2, model: 2}\npipeline: {micro_batches: 4}\nrules:\n"
                    "  - match: 'fc\\.weight'\n    layout: [pipe, null]\n",
                    6, 13, "layout splits over 'pipe', the pipeline's axis");
}

TEST(PipelinePlan, ComposesWithTheOtherAxes) {
  const Plan plan = parse_plan("version: 1\nmesh: {data: 2, pipe: auto, model: 2}\n"
                               "pipeline: {schedule: gpipe, micro_batches: 4}\nrules:\n"
                               "  - match: 'fc\\.weight'\n    layout: [model, null]\n",
                               "p.yaml");
  EXPECT_EQ(plan.batch_axis(), "data");
  EXPECT_EQ(plan.pipeline.axis, "pipe");
  EXPECT_EQ(plan.resolve_mesh(16).axis_size("pipe"), 4);
  // Sequence parallelism takes the one axis that is neither the batch's nor the pipeline's.
  const Plan sp = parse_plan("version: 1\nmesh: {data: 2, pipe: 2, model: 2}\npipeline: {micro_batches: 4}\n"
                             "sequence_parallel: {dim: 0}\nrules: []\n",
                             "p.yaml");
  EXPECT_EQ(sp.sequence_axis(), "model");
}

}  // namespace test_pipeline_plan
