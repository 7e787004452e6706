# torchrun-style restarts (`shardplan launch --max-restarts`, with the
# examples' --resume auto): a rank killed at a random step, the job restarted
# from its last checkpoint, equal losses and parameters to an uninterrupted
# run. The restart limit itself is tests/launcher.cmake's launcher.restart_limit.
find_program(SHARDPLAN_BASH bash REQUIRED)
add_test(NAME e2e_restart_kill COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/restart_kill.sh
  $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
set_tests_properties(e2e_restart_kill PROPERTIES TIMEOUT 120 LABELS faults)
# Issue 33, item 7: the newest checkpoint damaged while the job runs, a rank
# killed: the restart skips it, naming it, and goes on from the one before.
add_test(NAME e2e_restart_corrupt_newest COMMAND ${SHARDPLAN_BASH} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/restart_corrupt.sh
  $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
set_tests_properties(e2e_restart_corrupt_newest PROPERTIES TIMEOUT 180 LABELS faults)
# Bad --resume input: one line, before training.
add_test(NAME e2e_resume_bad_value COMMAND train_model --resume latest --save ${CMAKE_CURRENT_BINARY_DIR}/resume_unused)
add_test(NAME e2e_resume_needs_save COMMAND train_model --resume auto)
set_tests_properties(e2e_resume_bad_value PROPERTIES PASS_REGULAR_EXPRESSION "^train_model: --resume takes 'auto' only\n" TIMEOUT 60)
set_tests_properties(e2e_resume_needs_save PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_model: --resume auto needs --save DIR and no --load\n" TIMEOUT 60)
# Bad --keep values: one line, before training.
foreach(case zero:0 negative:-1 fraction:1.5 word:two)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 name)
  list(GET parts 1 value)
  add_test(NAME e2e_keep_bad_${name} COMMAND train_model --save ${CMAKE_CURRENT_BINARY_DIR}/keep_unused --keep ${value})
endforeach()
set_tests_properties(e2e_keep_bad_zero e2e_keep_bad_negative e2e_keep_bad_fraction e2e_keep_bad_word PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_model: --keep must be an integer from 1 to 2147483647, got '(0|-1|1\\.5|two)'\n" TIMEOUT 60)
add_test(NAME e2e_keep_needs_save COMMAND train_model --keep 3)
set_tests_properties(e2e_keep_needs_save PROPERTIES
  PASS_REGULAR_EXPRESSION "^train_model: --keep takes effect with --save DIR only\n" TIMEOUT 60)
