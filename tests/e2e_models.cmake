# The example models end to end: 20 training steps at 2 ranks, separate
# processes on gloo through the launcher, give the losses of 1 rank unsharded
# (float32, the bound measured by losses_match.sh), for each model under its
# plan (plans/<model>.yaml).
set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
foreach(model gpt convnet lstm_lm)
  set(_run $<TARGET_FILE:train_model> --model ${model} --steps 20 --log-every 1 --batch 8)
  add_test(NAME e2e_${model}_gloo_launcher COMMAND ${_e2e} float32 -- ${_run}
    -- $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo -- ${_run} --plan ${PROJECT_SOURCE_DIR}/plans/${model}.yaml)
  set_tests_properties(e2e_${model}_gloo_launcher PROPERTIES TIMEOUT 300)
endforeach()
# The demo's own binary and default path: ranks as threads, 4 ranks, float64
# (the tolerance is the printed precision, 8 decimals).
add_test(NAME e2e_gpt_threads4_f64 COMMAND ${_e2e} 1e-7
  -- $<TARGET_FILE:train_gpt> --steps 20 --log-every 1 --batch 8 --dtype float64
  -- $<TARGET_FILE:train_gpt> --steps 20 --log-every 1 --batch 8 --dtype float64 --ranks 4
     --plan ${PROJECT_SOURCE_DIR}/plans/gpt.yaml)
set_tests_properties(e2e_gpt_threads4_f64 PROPERTIES TIMEOUT 300)
