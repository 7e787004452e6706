# examples/train_script on the models examples/export_script_gpt.py and
# export_script_llama.py script with Debian's python3-torch (skipped, 77,
# without it), exported in float64: 5 Adam steps sharded by the example's
# plan with --compare, every loss within 1e-9 of the unsharded module's on
# the same batches and, with --generate, the same greedy text. Ranks are
# threads (--ranks) or gloo processes under the launcher.
find_program(SHARDPLAN_SCRIPT_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)

# The test `name`: exports with `exporter` into the build tree, then runs
# ARGN (train_script, or the launcher and train_script) with --model, --plan
# `plan` and the common options appended.
function(shardplan_script_example name exporter plan)
  add_test(NAME ${name} COMMAND sh -c
    "\"$1\" \"$2\" \"$3\" --double || exit $?; model=$3; shift 3; exec \"$@\" --model \"$model\""
    sh ${SHARDPLAN_SCRIPT_PYTHON3} ${PROJECT_SOURCE_DIR}/examples/${exporter} ${CMAKE_CURRENT_BINARY_DIR}/${name}.pt
    ${ARGN} --plan ${PROJECT_SOURCE_DIR}/examples/${plan} --steps 5 --compare)
  set_tests_properties(${name} PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endfunction()

if(TARGET train_script AND SHARDPLAN_SCRIPT_PYTHON3)
  set(_train_script $<TARGET_FILE:train_script>)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  shardplan_script_example(e2e_train_script_2 export_script_gpt.py script_gpt.yaml
    ${_train_script} --ranks 2 --verify --generate 20)
  shardplan_script_example(e2e_train_script_4 export_script_gpt.py script_gpt.yaml
    ${_train_script} --ranks 4 --verify)
  foreach(ranks 2 4)
    shardplan_script_example(e2e_train_script_llama_${ranks} export_script_llama.py script_llama.yaml
      ${_train_script} --ranks ${ranks} --generate 50)
  endforeach()
  # --clip: shardplan::clip_grad_norm_ over the sharded module, torch's over
  # the unsharded one (--compare: losses and norms agree), replicas checked
  # after every step; torch's on each rank's shards drifts and the first
  # check stops the run.
  shardplan_script_example(e2e_train_script_clip_2 export_script_gpt.py script_gpt.yaml
    ${_train_script} --ranks 2 --clip 0.05 --check-replicas 1)
  shardplan_script_example(e2e_train_script_clip_torch_caught_2 export_script_gpt.py script_gpt.yaml
    ${_train_script} --ranks 2 --clip 0.05 --clip-with torch --check-replicas 1)
  set_tests_properties(e2e_train_script_clip_torch_caught_2 PROPERTIES
    PASS_REGULAR_EXPRESSION "\ntrain_script: (rank [0-9]: )?step 1: replica check: " FAIL_REGULAR_EXPRESSION "step +2 ")
  # --model that is not a TorchScript module: one line naming the file.
  add_test(NAME train_script_bad_model COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/script/train_script_bad_model.sh
    ${_train_script} ${SHARDPLAN_SCRIPT_PYTHON3} ${PROJECT_SOURCE_DIR} ${CMAKE_CURRENT_BINARY_DIR}/train_script_bad_model)
  set_tests_properties(train_script_bad_model PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77)
  if(TARGET shardplan_cli)
    shardplan_script_example(e2e_train_script_gloo_2 export_script_gpt.py script_gpt.yaml
      ${_gloo} 2 -- ${_train_script} --generate 20)
    shardplan_script_example(e2e_train_script_gloo_4 export_script_gpt.py script_gpt.yaml
      ${_gloo} 4 -- ${_train_script})
    shardplan_script_example(e2e_train_script_llama_gloo_2 export_script_llama.py script_llama.yaml
      ${_gloo} 2 -- ${_train_script} --generate 50)
    shardplan_script_example(e2e_train_script_llama_gloo_4 export_script_llama.py script_llama.yaml
      ${_gloo} 4 -- ${_train_script})
  endif()
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
