# Checkpoints with real processes and the `shardplan ckpt` tool
# (docs/CHECKPOINTS.md). The unit tests (test_checkpoint*.cpp) run the tool
# for `convert --full`, so the gtest binary depends on it.
add_dependencies(shardplan_tests shardplan_ckpt)
if(TARGET train_model)
  # A rank SIGKILLed in the middle of a save: the launcher reports it, the
  # previous checkpoint stays intact and resumes with uninterrupted losses.
  add_test(NAME ckpt_kill_rank_during_save
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_kill.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model>
      ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
  # convert 2 -> 4, 2 -> 1, in place, --full; inspect of good and broken copies.
  add_test(NAME ckpt_cli
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_cli.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model>
      ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
  # Issue 33, item 7: --keep K, and --resume auto past a damaged newest
  # checkpoint (a flipped byte, a truncated file) to the one before it.
  add_test(NAME ckpt_keep_fallback
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_keep.sh $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
  set_tests_properties(ckpt_kill_rank_during_save ckpt_cli ckpt_keep_fallback PROPERTIES TIMEOUT 300 LABELS ckpt)
endif()
if(TARGET train_gpt)
  # {data: 2, model: 2} with ZeRO-1 -> {model: 2} -> plain -> {data: 2, model: 2}
  # -> ZeRO-1, processes on gloo: the losses of an uninterrupted run.
  add_test(NAME ckpt_2d_mesh_zero_gloo
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_2d.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_gpt>
      ${PROJECT_SOURCE_DIR}/plans)
  set_tests_properties(ckpt_2d_mesh_zero_gloo PROPERTIES TIMEOUT 300 LABELS "ckpt;data_parallel")
  # plans/gpt_sp.yaml -> plans/gpt_async.yaml -> plain: the same parameters
  # cut alike, so checkpoints move between them.
  add_test(NAME ckpt_sequence_parallel_gloo
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_sp.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_gpt>
      ${PROJECT_SOURCE_DIR}/plans)
  set_tests_properties(ckpt_sequence_parallel_gloo PROPERTIES TIMEOUT 300 LABELS ckpt)
endif()
if(TARGET train_gpt)
  # Issue 23, item 2: ZeRO-1 with AdamW, RMSprop and Adagrad (RMSprop and
  # Adagrad used to train, then fail at the first save) saves and resumes.
  add_test(NAME ckpt_zero_optimizers_threads
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_zero_optimizers.sh $<TARGET_FILE:train_gpt>
      ${CMAKE_CURRENT_SOURCE_DIR}/e2e/dp_zero.yaml)
  set_tests_properties(ckpt_zero_optimizers_threads PROPERTIES TIMEOUT 300 LABELS "ckpt;data_parallel")
endif()
