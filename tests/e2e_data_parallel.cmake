# Data parallelism end to end (docs/PLAN_FORMAT.md, "Data parallelism"): the
# GPT example, 20 steps in float64, prints the losses of one rank training
# on the same global batch (--batch is global), under {data: 2, model: 2}
# through the launcher on gloo (replicas checked every 5 steps), pure data
# parallelism with gradient accumulation, and ZeRO-1, as threads.
set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
set(_gpt $<TARGET_FILE:train_gpt> --steps 20 --log-every 1 --batch 8 --dtype float64
  --config context=16,embed=32,mlp=64)
add_test(NAME e2e_dp_gpt_2d_gloo_f64 COMMAND ${_e2e} 1e-7 -- ${_gpt}
  -- $<TARGET_FILE:shardplan_cli> launch -n 4 --backend gloo -- ${_gpt}
     --plan ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml --check-replicas 5)
add_test(NAME e2e_dp_gpt_data4_accumulate_gloo_f64 COMMAND ${_e2e} 1e-7 -- ${_gpt}
  -- $<TARGET_FILE:shardplan_cli> launch -n 4 --backend gloo -- ${_gpt}
     --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml --micro-batches 2 --check-replicas 10)
add_test(NAME e2e_dp_gpt_zero_threads4_f64 COMMAND ${_e2e} 1e-7 -- ${_gpt}
  -- ${_gpt} --ranks 4 --plan ${CMAKE_CURRENT_SOURCE_DIR}/e2e/dp_zero.yaml --check-replicas 10)
# Sequence parallelism composes with it: {data: 2, model: 2}, the sequence
# split within each model group (replicas, LayerNorms included, checked).
add_test(NAME e2e_dp_gpt_sp_2d_gloo_f64 COMMAND ${_e2e} 1e-7 -- ${_gpt}
  -- $<TARGET_FILE:shardplan_cli> launch -n 4 --backend gloo -- ${_gpt}
     --plan ${CMAKE_CURRENT_SOURCE_DIR}/e2e/gpt_sp_2d.yaml --check-replicas 5)
# The global batch must divide over the data ranks: a one-line error, nothing trained.
add_test(NAME e2e_dp_batch_not_divisible COMMAND ${_gpt} --ranks 4 --batch 6
  --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml)
set_tests_properties(e2e_dp_batch_not_divisible PROPERTIES
  PASS_REGULAR_EXPRESSION "error: (rank [0-9]: )?--batch 6 \\(the global batch\\) does not divide into 4 data rank\\(s\\) x 1 micro-batch")
# Nor may the micro-batches divide a data rank's slice unevenly: the same line
# (before step 1, one process or several ranks).
add_test(NAME e2e_dp_micro_batches_not_divisible COMMAND ${_gpt} --batch 6 --micro-batches 4)
add_test(NAME e2e_dp_micro_batches_not_divisible_data2 COMMAND ${_gpt} --ranks 4 --batch 8 --micro-batches 3
  --plan ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml)
set_tests_properties(e2e_dp_micro_batches_not_divisible PROPERTIES PASS_REGULAR_EXPRESSION
  "error: (rank [0-9]: )?--batch 6 \\(the global batch\\) does not divide into 1 data rank\\(s\\) x 4 micro-batch")
set_tests_properties(e2e_dp_micro_batches_not_divisible_data2 PROPERTIES PASS_REGULAR_EXPRESSION
  "error: (rank [0-9]: )?--batch 8 \\(the global batch\\) does not divide into 2 data rank\\(s\\) x 3 micro-batch")
set_tests_properties(e2e_dp_batch_not_divisible e2e_dp_micro_batches_not_divisible
  e2e_dp_micro_batches_not_divisible_data2 PROPERTIES FAIL_REGULAR_EXPRESSION "step +1 " TIMEOUT 60)
set_tests_properties(e2e_dp_gpt_2d_gloo_f64 e2e_dp_gpt_data4_accumulate_gloo_f64 e2e_dp_gpt_zero_threads4_f64
  e2e_dp_gpt_sp_2d_gloo_f64
  PROPERTIES TIMEOUT 300 LABELS data_parallel)
# The loss is averaged over the batch axis only at the steps that print it
# (with the local sum since the last line, for the mean, in the same call):
# 4 steps of a GPT in one bucket whose used flags ride in its all-reduce are
# 4 calls, plus 2 for the lines of steps 1 and 4 (every step's average made
# it 12).
add_test(NAME e2e_dp_loss_averaged_at_log_steps COMMAND ${_gpt} --ranks 2 --steps 4 --log-every 4
  --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml)
set_tests_properties(e2e_dp_loss_averaged_at_log_steps PROPERTIES
  PASS_REGULAR_EXPRESSION "rank 0: communicated [0-9]+ bytes in 6 calls over 4 steps" TIMEOUT 120 LABELS data_parallel)
