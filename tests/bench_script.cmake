# benchmarks/script as a smoke check, not a measurement: a tiny GPT exported
# by examples/export_script_gpt.py (Debian's python3-torch; skipped, 77,
# without it) trained for one round of each variant at 2 thread ranks (the
# bench fails when the twins' parameter counts or first losses differ), and
# parallelize_script timed once on 20 Linear layers.
find_program(SHARDPLAN_BENCH_SCRIPT_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDPLAN_BUILD_BENCHMARKS AND SHARDPLAN_BUILD_EXAMPLES AND SHARDPLAN_BENCH_SCRIPT_PYTHON3)
  add_test(NAME bench_script_smoke COMMAND sh -c
    "\"$1\" \"$2\" \"$3/bench_script_gpt.pt\" --embed 16 --heads 4 --context 8 --layers 1 || exit $?; \"$4\" --model \"$3/bench_script_gpt.pt\" --rounds 1 --steps 1 --batch 2 --linears 20 --runs 1"
    sh ${SHARDPLAN_BENCH_SCRIPT_PYTHON3} ${PROJECT_SOURCE_DIR}/examples/export_script_gpt.py ${CMAKE_CURRENT_BINARY_DIR}
    $<TARGET_FILE:bench_script>)
  set_tests_properties(bench_script_smoke PROPERTIES TIMEOUT 120 LABELS bench SKIP_RETURN_CODE 77)
endif()
