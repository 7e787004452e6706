# ZeRO-2 end to end (docs/PLAN_FORMAT.md, "ZeRO stages"): the GPT example in
# float64 through the launcher on gloo (and as threads) gives one unsharded
# process' losses on the same global batch to 1e-10, with Adam, AdamW and
# SGD, at {data: 2}, {data: 4} (with micro-batches: NoSync keeps whole
# gradients) and {data: 2, model: 2}, replicas checked; clipping reads the
# reduced slices. The plans: plans/gpt_2d.yaml and plans/data_parallel.yaml with
# ZeRO-2 and small buckets (several, slices cutting parameters), written to the
# build tree.
if(TARGET train_gpt AND TARGET shardplan_cli)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  set(_gpt $<TARGET_FILE:train_gpt> --steps 10 --log-every 1 --batch 8 --dtype float64
    --config context=16,embed=32,mlp=64)
  file(READ ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml _plan)
  string(REPLACE "data_parallel: {bucket_mb: 25}" "data_parallel: {bucket_mb: 0.02, zero: 2}" _z2 "${_plan}")
  file(READ ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml _plan_dp)
  string(REPLACE "rules: []" "data_parallel: {zero: 2, bucket_mb: 0.05}\nrules: []" _z2_dp "${_plan_dp}")
  if(_z2 STREQUAL _plan OR _z2_dp STREQUAL _plan_dp)
    message(FATAL_ERROR "plans/gpt_2d.yaml or plans/data_parallel.yaml changed: tests/e2e_zero.cmake finds no line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero2.yaml "${_z2}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/data_parallel_zero2.yaml "${_z2_dp}")
  set(_2d ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero2.yaml)
  set(_dp ${CMAKE_CURRENT_BINARY_DIR}/data_parallel_zero2.yaml)
  add_test(NAME e2e_zero2_gpt_2d_adam_gloo4_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} --
    ${_gloo} 4 -- ${_gpt} --plan ${_2d} --check-replicas 5)
  add_test(NAME e2e_zero2_gpt_data2_adamw_gloo2_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} --optimizer adamw --
    ${_gloo} 2 -- ${_gpt} --optimizer adamw --plan ${_dp} --check-replicas 5)
  add_test(NAME e2e_zero2_gpt_data4_sgd_accumulate_gloo4_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} --optimizer sgd --
    ${_gloo} 4 -- ${_gpt} --optimizer sgd --plan ${_dp} --micro-batches 2 --check-replicas 5)
  add_test(NAME e2e_zero2_gpt_2d_sgd_threads4_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} --optimizer sgd --
    ${_gpt} --optimizer sgd --ranks 4 --plan ${_2d} --check-replicas 5)
  # Clipping (SGD, every step clips): the norm of the ZeRO-2 slices.
  set(_clip ${_gpt} --optimizer sgd --lr 0.5 --clip 0.05)
  add_test(NAME e2e_zero2_clip_gpt_2d_gloo4_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.05 --
    ${_clip} --clip-with torch -- ${_gloo} 4 -- ${_clip} --plan ${_2d} --check-replicas 1)
  set_tests_properties(e2e_zero2_gpt_2d_adam_gloo4_f64 e2e_zero2_gpt_data2_adamw_gloo2_f64
    e2e_zero2_gpt_data4_sgd_accumulate_gloo4_f64 e2e_zero2_gpt_2d_sgd_threads4_f64 e2e_zero2_clip_gpt_2d_gloo4_f64
    PROPERTIES TIMEOUT 300 LABELS "data_parallel;zero")
endif()
# The memory and traffic bench (benchmarks/zero_memory), small: ZeRO-1, 2 and
# 3 within 5 % of the theoretical bytes per parameter and 1 % of the
# theoretical bytes per step, and its count option. (The benchmarks'
# directory is added after this one: the guard tests the options.)
if(SHARDPLAN_BUILD_BENCHMARKS AND SHARDPLAN_BUILD_EXAMPLES)
  add_test(NAME bench_zero_memory_check COMMAND bench_zero_memory --config context=16,embed=64,heads=4,layers=2,mlp=256
    --batch 4 --bucket-mb 0.05 --check 1)
  set_tests_properties(bench_zero_memory_check PROPERTIES TIMEOUT 120 LABELS "bench;zero"
    FAIL_REGULAR_EXPRESSION "off target")
  count_option_test(bench_zero_memory --batch $<TARGET_FILE:bench_zero_memory>)
endif()
