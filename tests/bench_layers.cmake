# benchmarks/layers as a smoke check, not a measurement: every layer's planned
# step once at world size 2 (local and gloo, ranks as threads), then once per
# row with ranks as gloo processes under the launcher. Fails on any row that
# errors. About 10 s on 2 cores.
if(NOT SHARDPLAN_BUILD_BENCHMARKS)
  return()
endif()
add_test(NAME bench_layers_threads
  COMMAND $<TARGET_FILE:bench_layers> --benchmark_min_time=0.000001 "--benchmark_filter=^shardplan/.*/world:2")
add_test(NAME bench_layers_gloo_procs
  COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo --timeout-ms 120000
    -- $<TARGET_FILE:bench_layers> --iters=1 --benchmark_filter=^shardplan/)
set_tests_properties(bench_layers_threads bench_layers_gloo_procs PROPERTIES
  TIMEOUT 120 LABELS bench FAIL_REGULAR_EXPRESSION "ERROR OCCURRED")
