# Issue 35 item 4 (tests/e2e/llama_bigger_than_rank_train.sh): under one
# per-process limit on private memory (prlimit --data, halfway between the
# measured peaks of a ZeRO-1 and a ZeRO-3 rank) a Llama trains 20 steps at
# {data: 2, model: 2} with ZeRO-3 and every block recomputed, 4 gloo
# processes, with the unsharded losses (float64, 1e-10), and the same plan
# with ZeRO-1 stops with one out-of-memory line naming what did not fit.
if(TARGET train_model AND TARGET shardplan_cli)
  file(READ ${PROJECT_SOURCE_DIR}/plans/llama.yaml _plan)
  foreach(_zero 1 3)
    string(REPLACE "mesh: {model: auto}"
      "mesh: {data: 2, model: 2}\ndata_parallel: {zero: ${_zero}}\nrecompute: ['model\\.layers\\.\\d+']" _p "${_plan}")
    if(_p STREQUAL _plan)
      message(FATAL_ERROR "plans/llama.yaml changed: tests/e2e_bigger_than_rank_train.cmake finds no mesh line to edit")
    endif()
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/llama_big_zero${_zero}.yaml "${_p}")
  endforeach()
  add_test(NAME e2e_llama_training_bigger_than_rank
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/llama_bigger_than_rank_train.sh $<TARGET_FILE:train_model>
      $<TARGET_FILE:shardplan_cli> ${CMAKE_CURRENT_BINARY_DIR}/llama_big_zero3.yaml
      ${CMAKE_CURRENT_BINARY_DIR}/llama_big_zero1.yaml ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh
      ${CMAKE_CURRENT_BINARY_DIR}/llama_training_bigger_than_rank)
  set_tests_properties(e2e_llama_training_bigger_than_rank PROPERTIES TIMEOUT 600 LABELS zero3)
endif()
