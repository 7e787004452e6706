# ZeRO-3 (`data_parallel: {zero: 3}`, issue 35) in the example trainer: the
# sharded GPT, each layer's parameters held as 1/D slices between uses, gives
# one unsharded process' run, float64, to 1e-10: every loss (and, with
# --clip, every total norm; shardplan::clip_grad_norm_ over the slices).
# SGD (with a clip far below the norms, so every step clips), Adam and AdamW;
# {data: 2}, {data: 4} and {data: 2, model: 2}; ranks as threads and as gloo
# processes; micro-batches under NoSync; the replicas checked every step.
if(TARGET train_gpt AND TARGET shardplan_cli)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  set(_gpt $<TARGET_FILE:train_gpt> --steps 6 --log-every 1 --batch 8 --dtype float64
    --config context=16,embed=32,mlp=64)
  file(READ ${PROJECT_SOURCE_DIR}/plans/gpt_2d.yaml _plan)
  string(REPLACE "data_parallel: {bucket_mb: 25}" "data_parallel: {bucket_mb: 25, zero: 3}" _z3 "${_plan}")
  file(READ ${PROJECT_SOURCE_DIR}/plans/data_parallel.yaml _plan_dp)
  string(REPLACE "rules: []" "data_parallel: {zero: 3}\nrules: []" _z3_dp "${_plan_dp}")
  if(_z3 STREQUAL _plan OR _z3_dp STREQUAL _plan_dp)
    message(FATAL_ERROR "plans/gpt_2d.yaml or plans/data_parallel.yaml changed: tests/e2e_zero3.cmake finds no line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero3.yaml "${_z3}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/data_parallel_zero3.yaml "${_z3_dp}")
  set(_2d ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero3.yaml)
  set(_dp ${CMAKE_CURRENT_BINARY_DIR}/data_parallel_zero3.yaml)

  set(_sgd --optimizer sgd --lr 0.5 --clip 0.05)
  set(_clip ${_e2e} 1e-10 --norms-above 0.05 -- ${_gpt} ${_sgd} --clip-with torch --)
  add_test(NAME e2e_zero3_gpt_2d_sgd_clip_threads4_f64 COMMAND ${_clip}
    ${_gpt} ${_sgd} --ranks 4 --plan ${_2d} --check-replicas 1)
  add_test(NAME e2e_zero3_gpt_2d_sgd_clip_gloo4_f64 COMMAND ${_clip}
    ${_gloo} 4 -- ${_gpt} ${_sgd} --plan ${_2d} --check-replicas 1)
  add_test(NAME e2e_zero3_gpt_data2_sgd_clip_gloo2_f64 COMMAND ${_clip}
    ${_gloo} 2 -- ${_gpt} ${_sgd} --plan ${_dp} --check-replicas 1)
  set(_tests e2e_zero3_gpt_2d_sgd_clip_threads4_f64 e2e_zero3_gpt_2d_sgd_clip_gloo4_f64
    e2e_zero3_gpt_data2_sgd_clip_gloo2_f64)
  foreach(_opt adam adamw)
    set(_o --optimizer ${_opt} --lr 0.01)
    set(_match ${_e2e} 1e-10 -- ${_gpt} ${_o} --)
    add_test(NAME e2e_zero3_gpt_2d_${_opt}_gloo4_f64 COMMAND ${_match}
      ${_gloo} 4 -- ${_gpt} ${_o} --plan ${_2d} --check-replicas 1)
    add_test(NAME e2e_zero3_gpt_data4_${_opt}_threads4_f64 COMMAND ${_match}
      ${_gpt} ${_o} --ranks 4 --plan ${_dp} --check-replicas 1)
    add_test(NAME e2e_zero3_gpt_data2_${_opt}_accumulate_gloo2_f64 COMMAND ${_match}
      ${_gloo} 2 -- ${_gpt} ${_o} --plan ${_dp} --micro-batches 2 --check-replicas 1)
    list(APPEND _tests e2e_zero3_gpt_2d_${_opt}_gloo4_f64 e2e_zero3_gpt_data4_${_opt}_threads4_f64
      e2e_zero3_gpt_data2_${_opt}_accumulate_gloo2_f64)
  endforeach()
  # With sequence parallelism and with async tensor parallelism on the model
  # axis: plans/gpt_sp.yaml and plans/gpt_async.yaml on {data: 2, model: 2}.
  foreach(_kind sp async)
    file(READ ${PROJECT_SOURCE_DIR}/plans/gpt_${_kind}.yaml _p)
    string(REPLACE "mesh: {model: auto}" "mesh: {data: 2, model: 2}\ndata_parallel: {zero: 3}" _p3 "${_p}")
    if(_p3 STREQUAL _p)
      message(FATAL_ERROR "plans/gpt_${_kind}.yaml changed: tests/e2e_zero3.cmake finds no mesh line to edit")
    endif()
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_${_kind}_zero3.yaml "${_p3}")
    set(_o --optimizer adam --lr 0.01)
    add_test(NAME e2e_zero3_gpt_${_kind}_2d_adam_threads4_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} ${_o} --
      ${_gpt} ${_o} --ranks 4 --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_${_kind}_zero3.yaml --check-replicas 1)
    list(APPEND _tests e2e_zero3_gpt_${_kind}_2d_adam_threads4_f64)
  endforeach()
  # With activation recomputation (the recompute: key): every block full on
  # {data: 2, model: 2}, gloo processes, micro-batches; the layers' gates
  # gather again inside the recomputed forwards.
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero3_recompute.yaml "${_z3}\nrecompute: ['blocks\\.\\d+']\n")
  set(_o --optimizer adam --lr 0.01)
  add_test(NAME e2e_zero3_gpt_2d_recompute_accumulate_gloo4_f64 COMMAND ${_e2e} 1e-10 -- ${_gpt} ${_o} --
    ${_gloo} 4 -- ${_gpt} ${_o} --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_2d_zero3_recompute.yaml --micro-batches 2
    --check-replicas 1)
  list(APPEND _tests e2e_zero3_gpt_2d_recompute_accumulate_gloo4_f64)
  # The Llama (RMSNorm; with tie=1 its LM head shares the embedding's
  # weight, which stays whole on every rank and is sharded as under ZeRO-2).
  if(TARGET train_model)
    file(READ ${PROJECT_SOURCE_DIR}/plans/llama.yaml _p)
    string(REPLACE "mesh: {model: auto}" "mesh: {data: 2, model: 2}\ndata_parallel: {zero: 3}" _p3 "${_p}")
    if(_p3 STREQUAL _p)
      message(FATAL_ERROR "plans/llama.yaml changed: tests/e2e_zero3.cmake finds no mesh line to edit")
    endif()
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/llama_zero3.yaml "${_p3}")
    foreach(_tie 0 1)
      set(_llama $<TARGET_FILE:train_model> --model llama --steps 4 --log-every 1 --batch 4 --dtype float64
        --optimizer adam --lr 0.01 --config context=16,embed=32,layers=2,tie=${_tie})
      add_test(NAME e2e_zero3_llama_tie${_tie}_2d_gloo4_f64 COMMAND ${_e2e} 1e-10 -- ${_llama} --
        ${_gloo} 4 -- ${_llama} --plan ${CMAKE_CURRENT_BINARY_DIR}/llama_zero3.yaml --check-replicas 1)
      list(APPEND _tests e2e_zero3_llama_tie${_tie}_2d_gloo4_f64)
    endforeach()
  endif()
  # The trainer's summary names the stage whose slices it counts.
  add_test(NAME e2e_zero3_trainer_names_the_stage COMMAND ${_gpt} --optimizer adam --ranks 2 --plan ${_dp})
  set_tests_properties(e2e_zero3_trainer_names_the_stage PROPERTIES
    PASS_REGULAR_EXPRESSION "rank 1: optimizer state [0-9]+ bytes \\(ZeRO-3 slices\\)")
  list(APPEND _tests e2e_zero3_trainer_names_the_stage)
  set_tests_properties(${_tests} PROPERTIES TIMEOUT 300 LABELS zero3)
endif()
