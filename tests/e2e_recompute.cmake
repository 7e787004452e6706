# Activation recomputation in the example trainers (issue 35): the GPT and
# the Llama trained under a plan that recomputes every block (full) or
# attention's core (selective) print the losses of the same plan without
# it, float64, to 1e-12 relative: attention dropout on (the GPT's masks are
# drawn again in backward from the replayed streams), tensor, sequence and
# async tensor parallelism, {data: 2, model: 2} with micro-batches and
# ZeRO-1. The recomputing run's ranks are gloo processes (against the
# reference's as threads: losses_match.sh takes one launcher) or threads.
if(TARGET train_gpt AND TARGET shardplan_cli)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  # plans/<src>.yaml with a recompute: list, written to the build tree.
  function(_recompute_plan src name entries)
    file(READ ${PROJECT_SOURCE_DIR}/plans/${src}.yaml _plan)
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/${name}.yaml "${_plan}\nrecompute: ${entries}\n")
  endfunction()
  set(_gpt_full "['blocks\\.\\d+']")
  set(_gpt_sel "[{module: 'blocks\\.\\d+\\.attn', mode: selective}]")
  _recompute_plan(gpt gpt_recompute_full "${_gpt_full}")
  _recompute_plan(gpt_sp gpt_sp_recompute_selective "${_gpt_sel}")
  _recompute_plan(gpt_async gpt_async_recompute_full "${_gpt_full}")
  file(READ ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml _plan)
  string(REPLACE "data_parallel: {bucket_mb: 25}" "data_parallel: {bucket_mb: 0.02, zero: true}" _zero "${_plan}")
  if(_zero STREQUAL _plan)
    message(FATAL_ERROR "plans/gpt_2d.yaml changed: tests/e2e_recompute.cmake finds no data_parallel line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero_plain.yaml "${_zero}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero_recompute.yaml "${_zero}\nrecompute: ${_gpt_full}\n")

  set(_gpt $<TARGET_FILE:train_gpt> --steps 4 --log-every 1 --batch 8 --dtype float64 --optimizer adam --lr 0.01
    --config context=16,embed=32,mlp=64,heads=4,dropout=0.1)
  set(_b ${CMAKE_CURRENT_BINARY_DIR})
  set(_p ${PROJECT_SOURCE_DIR}/plans)
  add_test(NAME e2e_recompute_gpt_full_gloo2_f64 COMMAND ${_e2e} 1e-12
    -- ${_gpt} --ranks 2 --plan ${_p}/gpt.yaml -- ${_gloo} 2 -- ${_gpt} --plan ${_b}/gpt_recompute_full.yaml)
  add_test(NAME e2e_recompute_gpt_sp_selective_gloo2_f64 COMMAND ${_e2e} 1e-12
    -- ${_gpt} --ranks 2 --plan ${_p}/gpt_sp.yaml -- ${_gloo} 2 -- ${_gpt} --plan ${_b}/gpt_sp_recompute_selective.yaml)
  add_test(NAME e2e_recompute_gpt_async_full_threads4_f64 COMMAND ${_e2e} 1e-12
    -- ${_gpt} --ranks 4 --plan ${_p}/gpt_async.yaml -- ${_gpt} --ranks 4 --plan ${_b}/gpt_async_recompute_full.yaml)
  add_test(NAME e2e_recompute_gpt_2d_zero_accumulate_gloo4_f64 COMMAND ${_e2e} 1e-12
    -- ${_gpt} --ranks 4 --micro-batches 2 --plan ${_b}/gpt_2d_zero_plain.yaml
    -- ${_gloo} 4 -- ${_gpt} --micro-batches 2 --plan ${_b}/gpt_2d_zero_recompute.yaml)
  # The run says what it recomputes (and so the comparisons above compare a
  # recomputing run).
  add_test(NAME e2e_recompute_trainer_names_modules COMMAND $<TARGET_FILE:train_gpt> --ranks 2 --steps 1
    --config context=16,embed=32,mlp=64,heads=4 --plan ${_b}/gpt_recompute_full.yaml)
  set_tests_properties(e2e_recompute_trainer_names_modules PROPERTIES
    PASS_REGULAR_EXPRESSION "recompute full: 2 modules" TIMEOUT 120 LABELS recompute)
  set_tests_properties(e2e_recompute_gpt_full_gloo2_f64 e2e_recompute_gpt_sp_selective_gloo2_f64
    e2e_recompute_gpt_async_full_threads4_f64 e2e_recompute_gpt_2d_zero_accumulate_gloo4_f64
    PROPERTIES TIMEOUT 300 LABELS recompute)

  if(TARGET train_model)
    _recompute_plan(llama_sp llama_sp_recompute_full "['model\\.layers\\.\\d+']")
    _recompute_plan(llama llama_recompute_selective "[{module: 'model\\.layers\\.\\d+\\.self_attn', mode: selective}]")
    set(_llama $<TARGET_FILE:train_model> --model llama --steps 4 --log-every 1 --batch 4 --dtype float64
      --optimizer adam --lr 0.01 --config context=16,embed=32,layers=2)
    add_test(NAME e2e_recompute_llama_sp_full_gloo2_f64 COMMAND ${_e2e} 1e-12
      -- ${_llama} --ranks 2 --plan ${_p}/llama_sp.yaml -- ${_gloo} 2 -- ${_llama} --plan ${_b}/llama_sp_recompute_full.yaml)
    add_test(NAME e2e_recompute_llama_selective_threads4_f64 COMMAND ${_e2e} 1e-12
      -- ${_llama} --ranks 4 --plan ${_p}/llama.yaml -- ${_llama} --ranks 4 --plan ${_b}/llama_recompute_selective.yaml)
    set_tests_properties(e2e_recompute_llama_sp_full_gloo2_f64 e2e_recompute_llama_selective_threads4_f64
      PROPERTIES TIMEOUT 300 LABELS recompute)
  endif()
  # The benchmarks' directory comes after this one: guarded by its options.
  if(SHARDPLAN_BUILD_BENCHMARKS AND SHARDPLAN_BUILD_EXAMPLES)
    add_test(NAME bench_recompute_smoke COMMAND bench_recompute --ranks 1,2 --reps 1 --batch 2
      --gpt context=16,embed=32,heads=4,layers=2,mlp=64,dropout=0.1 --llama context=16,embed=32,heads=4,kv_heads=2,layers=2,mlp=64)
    set_tests_properties(bench_recompute_smoke PROPERTIES TIMEOUT 120 LABELS recompute
      PASS_REGULAR_EXPRESSION "2 +selective" FAIL_REGULAR_EXPRESSION "error")
  endif()
endif()
