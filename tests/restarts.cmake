# torchrun-style restarts (`shardplan launch --max-restarts`, with the
# examples' --resume auto): a rank killed at a random step, the job restarted
# from its last checkpoint, equal losses and parameters to an uninterrupted
# run. The restart limit itself is tests/launcher.cmake's launcher.restart_limit.
find_program(SHARDPLAN_BASH bash REQUIRED)
add_test(NAME e2e_restart_kill COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/restart_kill.sh
  $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
set_tests_properties(e2e_restart_kill PROPERTIES TIMEOUT 120 LABELS faults)
# Bad --resume input: one line, before training.
add_test(NAME e2e_resume_bad_value COMMAND train_model --resume latest --save ${CMAKE_CURRENT_BINARY_DIR}/resume_unused)
add_test(NAME e2e_resume_needs_save COMMAND train_model --resume auto)
set_tests_properties(e2e_resume_bad_value PROPERTIES PASS_REGULAR_EXPRESSION "^train_model: --resume takes 'auto' only\n" TIMEOUT 60)
set_tests_properties(e2e_resume_needs_save PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_model: --resume auto needs --save DIR and no --load\n" TIMEOUT 60)
