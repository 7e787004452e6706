# benchmarks/replica_check as a smoke check, not a measurement: one round of
# one step, check and clip of a tiny GPT under plans/gpt.yaml, 2 gloo
# processes (the run fails if check_replicas finds a drift or clipping
# throws). About 2 s.
if(NOT SHARDPLAN_BUILD_BENCHMARKS OR NOT SHARDPLAN_BUILD_EXAMPLES)
  return()
endif()
add_test(NAME bench_replica_check_smoke
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_replica_check> --plan ${PROJECT_SOURCE_DIR}/plans/gpt.yaml
    --config embed=32,heads=2,layers=1,mlp=64,context=16 --batch 4 --rounds 1 --steps 1 --calls 1)
set_tests_properties(bench_replica_check_smoke PROPERTIES TIMEOUT 120 LABELS bench)
