# Gradient clipping in the example trainers (issue 34): --clip X through
# shardplan::clip_grad_norm_ on the sharded GPT gives one unsharded process'
# run with torch's clip_grad_norm_ (--clip-with torch), float64, to 1e-10:
# every loss and every printed total norm. SGD, whose update is the clipped
# gradient itself (Adam's hardly depends on its scale), and a --clip far
# below the norms (losses_match.sh --norms-above checks the reference's
# norm exceeds it at every step: every step clips). The sharded runs check
# their replicas after every step. Ranks as threads and as gloo processes,
# {model: 2}, {model: 4}, {data: 2, model: 2} and the same with ZeRO-1.
if(TARGET train_gpt AND TARGET shardplan_cli)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  set(_clip 0.05)
  set(_gpt $<TARGET_FILE:train_gpt> --steps 6 --log-every 1 --batch 8 --dtype float64 --optimizer sgd --lr 0.5
    --config context=16,embed=32,mlp=64 --clip ${_clip})
  set(_ref ${_gpt} --clip-with torch)
  set(_tp ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
  set(_2d ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml)
  # {data: 2, model: 2} with ZeRO-1: plans/gpt_2d.yaml with zero: true.
  file(READ ${_2d} _plan)
  string(REPLACE "data_parallel: {bucket_mb: 25}" "data_parallel: {bucket_mb: 0.02, zero: true}" _zero "${_plan}")
  if(_zero STREQUAL _plan)
    message(FATAL_ERROR "plans/gpt_2d.yaml changed: tests/e2e_clip.cmake finds no data_parallel line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero.yaml "${_zero}")
  set(_zero_plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero.yaml)

  set(_match ${_e2e} 1e-10 --norms-above ${_clip} -- ${_ref} --)
  add_test(NAME e2e_clip_gpt_threads2_f64 COMMAND ${_match} ${_gpt} --ranks 2 --plan ${_tp} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_threads4_f64 COMMAND ${_match} ${_gpt} --ranks 4 --plan ${_tp} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_gloo2_f64 COMMAND ${_match} ${_gloo} 2 -- ${_gpt} --plan ${_tp} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_gloo4_f64 COMMAND ${_match} ${_gloo} 4 -- ${_gpt} --plan ${_tp} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_2d_threads4_f64 COMMAND ${_match} ${_gpt} --ranks 4 --plan ${_2d} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_2d_gloo4_f64 COMMAND ${_match} ${_gloo} 4 -- ${_gpt} --plan ${_2d} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_2d_zero_threads4_f64 COMMAND ${_match}
    ${_gpt} --ranks 4 --plan ${_zero_plan} --check-replicas 1)
  add_test(NAME e2e_clip_gpt_2d_zero_gloo4_f64 COMMAND ${_match}
    ${_gloo} 4 -- ${_gpt} --plan ${_zero_plan} --check-replicas 1)
  # With micro-batches the clip sees the whole step's gradient.
  add_test(NAME e2e_clip_gpt_2d_accumulate_threads4_f64 COMMAND ${_match}
    ${_gpt} --ranks 4 --plan ${_2d} --micro-batches 2 --check-replicas 1)
  # With the lr schedule (warmup, cosine decay): the lr changes, the clip too.
  add_test(NAME e2e_clip_gpt_schedule_2d_zero_threads4_f64 COMMAND ${_e2e} 1e-10 --norms-above ${_clip}
    -- ${_ref} --warmup 2 --lr-min 0.05 -- ${_gpt} --warmup 2 --lr-min 0.05 --ranks 4 --plan ${_zero_plan}
    --check-replicas 1)
  set_tests_properties(e2e_clip_gpt_schedule_2d_zero_threads4_f64 PROPERTIES TIMEOUT 300 LABELS clip)
  set_tests_properties(e2e_clip_gpt_threads2_f64 e2e_clip_gpt_threads4_f64 e2e_clip_gpt_gloo2_f64
    e2e_clip_gpt_gloo4_f64 e2e_clip_gpt_2d_threads4_f64 e2e_clip_gpt_2d_gloo4_f64 e2e_clip_gpt_2d_zero_threads4_f64
    e2e_clip_gpt_2d_zero_gloo4_f64 e2e_clip_gpt_2d_accumulate_threads4_f64 PROPERTIES TIMEOUT 300 LABELS clip)

  # torch's clip_grad_norm_ on shards (each rank the norm of its own
  # shards): the replicated LayerNorms drift from step 1, and the replica
  # check on by default (every 10 steps) stops the run at its first check,
  # step 10, with one line naming the parameter and the usual causes; every
  # rank exits, no step after it runs.
  set(_drift $<TARGET_FILE:train_gpt> --steps 60 --log-every 1 --batch 8 --optimizer sgd --lr 0.5
    --config context=16,embed=32,mlp=64,layers=1 --clip ${_clip} --clip-with torch --plan ${_tp})
  add_test(NAME e2e_clip_torch_on_shards_caught_threads2 COMMAND ${_drift} --ranks 2)
  add_test(NAME e2e_clip_torch_on_shards_caught_gloo2 COMMAND ${_gloo} 2 -- ${_drift})
  set_tests_properties(e2e_clip_torch_on_shards_caught_threads2 e2e_clip_torch_on_shards_caught_gloo2 PROPERTIES
    PASS_REGULAR_EXPRESSION "error: (rank [0-9]: )?step 10: replica check: "
    FAIL_REGULAR_EXPRESSION "step +1[1-9] " TIMEOUT 120 LABELS clip)
  # --check-replicas 0 turns the default check off: the drifting run ends
  # without an error (the check, not the run, stopped it above).
  add_test(NAME e2e_clip_torch_on_shards_check_off_threads2 COMMAND ${_drift} --ranks 2 --check-replicas 0)
  set_tests_properties(e2e_clip_torch_on_shards_check_off_threads2 PROPERTIES
    PASS_REGULAR_EXPRESSION "step +60 " FAIL_REGULAR_EXPRESSION "error|replica check" TIMEOUT 120 LABELS clip)
  # Ours with the same options passes the checks.
  add_test(NAME e2e_clip_ours_passes_replica_check_threads2 COMMAND ${_drift} --ranks 2 --clip-with shardplan)
  set_tests_properties(e2e_clip_ours_passes_replica_check_threads2 PROPERTIES
    PASS_REGULAR_EXPRESSION "step +60 " FAIL_REGULAR_EXPRESSION "error" TIMEOUT 120 LABELS clip)

  # The Llama: kv heads shared by 2 ranks each at 4 ranks (counted once),
  # and sequence parallelism (its RMSNorm gradients summed in backward).
  if(TARGET train_model)
    set(_llama $<TARGET_FILE:train_model> --model llama --steps 4 --log-every 1 --batch 4 --dtype float64
      --optimizer sgd --lr 0.5 --config context=16,embed=32,layers=1 --clip ${_clip})
    add_test(NAME e2e_clip_llama_shared_kv_threads4_f64 COMMAND ${_e2e} 1e-10 --norms-above ${_clip}
      -- ${_llama} --clip-with torch -- ${_llama} --ranks 4 --plan ${PROJECT_SOURCE_DIR}/plans/llama.yaml --check-replicas 1)
    add_test(NAME e2e_clip_llama_sp_threads2_f64 COMMAND ${_e2e} 1e-10 --norms-above ${_clip}
      -- ${_llama} --clip-with torch -- ${_llama} --ranks 2 --plan ${PROJECT_SOURCE_DIR}/plans/llama_sp.yaml
      --check-replicas 1)
    set_tests_properties(e2e_clip_llama_shared_kv_threads4_f64 e2e_clip_llama_sp_threads2_f64 PROPERTIES
      TIMEOUT 120 LABELS clip)
  endif()

  # train_mlp: {fc1, fc2, fc3} column/row/column-parallel (plans/mlp.yaml).
  if(TARGET train_mlp)
    set(_mlp $<TARGET_FILE:train_mlp> --steps 10 --dtype float64 --optimizer sgd --clip 0.05)
    add_test(NAME e2e_clip_mlp_threads2_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.05 -- ${_mlp} --clip-with torch
      -- ${_mlp} --ranks 2 --plan ${PROJECT_SOURCE_DIR}/plans/mlp.yaml --check-replicas 1)
    set_tests_properties(e2e_clip_mlp_threads2_f64 PROPERTIES TIMEOUT 120 LABELS clip)
  endif()

  # Bad --clip values: one line naming the option, nothing trained.
  foreach(bad 0 -1 nan inf)
    add_test(NAME e2e_clip_option_bad_${bad} COMMAND train_gpt --steps 3 --clip ${bad})
    set_tests_properties(e2e_clip_option_bad_${bad} PROPERTIES
      PASS_REGULAR_EXPRESSION "^train_gpt: --clip takes a positive finite number \\(the largest gradient norm\\), got '${bad}'\n"
      FAIL_REGULAR_EXPRESSION "step +1 " TIMEOUT 60 LABELS clip)
  endforeach()
  add_test(NAME e2e_clip_option_with_alone COMMAND train_gpt --steps 3 --clip-with torch)
  set_tests_properties(e2e_clip_option_with_alone PROPERTIES
    PASS_REGULAR_EXPRESSION "^train_gpt: --clip-with takes effect with --clip X only\n"
    FAIL_REGULAR_EXPRESSION "step +1 " TIMEOUT 60 LABELS clip)
endif()
