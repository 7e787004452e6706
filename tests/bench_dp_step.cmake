# benchmarks/dp_step as a smoke check, not a measurement: one round of one
# step per mode (overlap on, off, no sync, ZeRO-1) of a tiny GPT in buckets
# of a few KiB, under the launcher with gloo processes, {data: 2} and
# {data: 2, model: 2} over gloo's TCP transport (SHARDPLAN_GLOO_SHM=off: the
# bytes on the wire are measured on the sockets), and {data: 2} on the
# default same-host shared-memory path. --check 1 fails the run unless the
# bytes handed to the batch axis and written to the sockets are the expected
# ones and ZeRO-1 holds 1/D of the optimizer state; the bench itself always
# fails when the losses with overlap on and off differ or the replicas
# drift. About 15 s.
if(NOT SHARDPLAN_BUILD_BENCHMARKS OR NOT SHARDPLAN_BUILD_EXAMPLES)
  return()
endif()
set(_dp_small --config embed=32,heads=2,layers=1,mlp=64,context=16 --batch 4 --rounds 1 --steps 1
  --bucket-mb 0.01 --check 1)
add_test(NAME bench_dp_step_data2
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_dp_step> --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml ${_dp_small})
add_test(NAME bench_dp_step_data2_model2
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 4 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_dp_step> --plan ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml ${_dp_small})
add_test(NAME bench_dp_step_data2_shm
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_dp_step> --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml ${_dp_small})
set_tests_properties(bench_dp_step_data2 bench_dp_step_data2_model2 PROPERTIES ENVIRONMENT SHARDPLAN_GLOO_SHM=off)
set_tests_properties(bench_dp_step_data2 bench_dp_step_data2_model2 bench_dp_step_data2_shm PROPERTIES
  TIMEOUT 120 LABELS bench)
# ZeRO-3 with prefetch on and off (SHARDPLAN_ZERO3_PREFETCH=0): the bench
# fails unless both give the same losses, "z3" prefetches and "z3np" does
# not; the hidden share is printed (its figure is in docs/BENCHMARKS.md).
add_test(NAME bench_dp_step_zero3
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_dp_step> --plan ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml ${_dp_small}
    --rounds 2 --modes z3,z3np)
set_tests_properties(bench_dp_step_zero3 PROPERTIES TIMEOUT 120 LABELS bench
  PASS_REGULAR_EXPRESSION "gathers hidden 1 - wait\\(on\\)/wait\\(off\\), rank waiting least"
  FAIL_REGULAR_EXPRESSION "bench_dp_step: rank|error")
