# examples/train_script on the GPT examples/export_script_gpt.py scripts with
# Debian's python3-torch (skipped, 77, without it): 5 Adam steps head-parallel
# at 2 and 4 thread ranks in float64, every loss within 1e-9 of the
# unsharded module's on the same batches.
find_program(SHARDPLAN_SCRIPT_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(TARGET train_script AND SHARDPLAN_SCRIPT_PYTHON3)
  foreach(ranks 2 4)
    add_test(NAME e2e_train_script_${ranks} COMMAND sh -c
      "\"$1\" \"$2\" \"$3/script_gpt_${ranks}.pt\" --double || exit $?; \"$4\" --model \"$3/script_gpt_${ranks}.pt\" --plan \"$5\" --ranks ${ranks} --steps 5 --verify --compare"
      sh ${SHARDPLAN_SCRIPT_PYTHON3} ${PROJECT_SOURCE_DIR}/examples/export_script_gpt.py ${CMAKE_CURRENT_BINARY_DIR}
      $<TARGET_FILE:train_script> ${PROJECT_SOURCE_DIR}/examples/script_gpt.yaml)
    set_tests_properties(e2e_train_script_${ranks} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
  endforeach()
endif()

# `shardplan plan check --script ... --probe ...` on the traced GPT twins:
# refused without a probe, passed with one, and the baked twin's difference
# reported (tests/script/plan_check_script.sh).
if(TARGET shardplan_plan AND SHARDPLAN_SCRIPT_PYTHON3)
  add_test(NAME plan_check_script_verify COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/script/plan_check_script.sh
    $<TARGET_FILE:shardplan_cli> ${SHARDPLAN_SCRIPT_PYTHON3} ${PROJECT_SOURCE_DIR}
    ${CMAKE_CURRENT_BINARY_DIR}/plan_check_script)
  set_tests_properties(plan_check_script_verify PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
