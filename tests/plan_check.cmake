# The plan checker (`shardplan plan check`, docs/PLAN_CHECK.md): its reports
# for the example plans against golden files, one broken plan per problem
# class, and --state-dict on a torch::save file and a sharded checkpoint.
# Regenerating the goldens after an intended change: docs/PLAN_CHECK.md, "Tests".
if(TARGET shardplan_plan)
  add_executable(plan_check_write_state_dicts plan_check/write_state_dicts.cpp)
  target_link_libraries(plan_check_write_state_dicts PRIVATE shardplan::shardplan shardplan_example_models)
  add_dependencies(plan_check_write_state_dicts shardplan_plugins)
  set(_pc_args -DCLI=$<TARGET_FILE:shardplan_cli> -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
               -DWRITER=$<TARGET_FILE:plan_check_write_state_dicts> -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/plan_check)
  foreach(part golden broken state_dict)
    add_test(NAME plan_check_${part} COMMAND ${CMAKE_COMMAND} ${_pc_args} -DPART=${part}
      -P ${CMAKE_CURRENT_SOURCE_DIR}/plan_check/run.cmake)
    set_tests_properties(plan_check_${part} PROPERTIES TIMEOUT 300)
  endforeach()
  # `shardplan plan auto` (docs/AUTO_PLAN.md) for each example model.
  set(_auto_gpt "  - match: 'blocks\\.\\d+\\.fc2\\.weight'")
  set(_auto_convnet "  # output-channel-parallel conv1, output left split: only conv2 reads it (through relu)")
  set(_auto_lstm_lm "  - match: 'loss'")
  set(_auto_llama "  - match: 'model\\.layers\\.\\d+\\.self_attn\\.o_proj\\.weight'")
  set(_auto_gpt2 "    blocks: 3")
  foreach(model gpt convnet lstm_lm llama gpt2)
    add_test(NAME plan_auto_${model} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/plan_check/auto.sh
      $<TARGET_FILE:shardplan_cli> ${model} "${_auto_${model}}" ${CMAKE_CURRENT_BINARY_DIR}/plan_check)
    set_tests_properties(plan_auto_${model} PROPERTIES TIMEOUT 300)
  endforeach()
  # --mesh, --torchscript (a module Debian's python3-torch scripts at run
  # time; skipped without it) and --state-dict, with bad input of each.
  set(_auto_file_torchscript /usr/bin/python3)
  set(_auto_file_state_dict $<TARGET_FILE:plan_check_write_state_dicts>)
  foreach(mode mesh torchscript state_dict)
    add_test(NAME plan_auto_file_${mode} COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/plan_check/auto_file.sh
      $<TARGET_FILE:shardplan_cli> ${mode} ${CMAKE_CURRENT_BINARY_DIR}/plan_check ${_auto_file_${mode}})
    set_tests_properties(plan_auto_file_${mode} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
  endforeach()
endif()
