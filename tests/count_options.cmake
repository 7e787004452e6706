# Every count option of the example trainers, the tools and the benchmarks is
# read by one parser (shardplan/count_option.h): "1e9", "3x", "-1", a value
# past 2^63 and an empty one are refused with one line naming the option,
# before anything runs (tests/e2e/count_options.sh). train_script --steps 1e9
# used to train one step and exit 0, as std::stoi reads "1e9" as 1.
# count_option_test(NAME OPTION COMMAND...): COMMAND gets OPTION VALUE
# appended, or VALUE where an argument is {}.
set(_count_sh ${CMAKE_CURRENT_SOURCE_DIR}/e2e/count_options.sh)
function(count_option_test name option)
  add_test(NAME count_option_${name} COMMAND ${_count_sh} ${option} ${ARGN})
  set_tests_properties(count_option_${name} PROPERTIES TIMEOUT 120 LABELS count_options)
endfunction()

count_option_test(launch_nproc -n/--nproc-per-node $<TARGET_FILE:shardplan_cli> launch -n {} -- /bin/true)
count_option_test(launch_max_restarts --max-restarts
  $<TARGET_FILE:shardplan_cli> launch -n 1 --max-restarts {} -- /bin/true)
count_option_test(ckpt_to_world --to-world $<TARGET_FILE:shardplan_ckpt> convert /nonexistent --to-world {})
if(SHARDPLAN_BUILD_EXAMPLES)
  foreach(option --steps --ranks --batch --generate)
    string(REPLACE "-" "" _o ${option})
    count_option_test(train_gpt_${_o} ${option} $<TARGET_FILE:train_gpt>)
    count_option_test(train_script_${_o} ${option} $<TARGET_FILE:train_script>)
  endforeach()
  foreach(option --log-every --threads --save-every --micro-batches --check-replicas --warmup --top-k --samples)
    string(REPLACE "-" "" _o ${option})
    count_option_test(train_model_${_o} ${option} $<TARGET_FILE:train_model> --model llama)
  endforeach()
  foreach(option --steps --hidden --threads)
    string(REPLACE "-" "" _o ${option})
    count_option_test(train_mlp_${_o} ${option} $<TARGET_FILE:train_mlp>)
  endforeach()
  count_option_test(plan_world --world $<TARGET_FILE:shardplan_plan> check --model gpt --world {})
endif()
# (The benchmarks' directory is added after this one: the guards test the
# options that build them, as tests/bench.cmake does.)
if(SHARDPLAN_BUILD_BENCHMARKS)
  count_option_test(bench_comm_gloo --ranks $<TARGET_FILE:bench_comm_gloo>)
  count_option_test(bench_comm_local --reps $<TARGET_FILE:bench_comm_local>)
  if(SHARDPLAN_BUILD_EXAMPLES)
    count_option_test(bench_dp_step --steps $<TARGET_FILE:bench_dp_step>)
    count_option_test(bench_gpt_step --rounds $<TARGET_FILE:bench_gpt_step>)
    count_option_test(bench_mlp_step ROUNDS $<TARGET_FILE:bench_mlp_step> ${PROJECT_SOURCE_DIR}/plans/mlp.yaml {})
    count_option_test(bench_async_tp --steps $<TARGET_FILE:bench_async_tp>)
    count_option_test(bench_script --steps $<TARGET_FILE:bench_script>)
    count_option_test(bench_sp_memory --batch $<TARGET_FILE:bench_sp_memory>)
    count_option_test(bench_llama_load --ranks $<TARGET_FILE:bench_llama_load>)
  endif()
endif()
