# `shardplan bench comm` (tools/bench): small sizes with --check on every
# backend that can run here, its CSV/JSON against the columns documented in
# docs/BENCHMARKS.md, and how it fails (a rank dying or hanging, a wrong
# element, a missing gnuplot, a bad option). Run through the `shardplan`
# dispatcher, as users do. About 30 s in all on 2 cores.
set(_bench_dir ${CMAKE_CURRENT_BINARY_DIR}/bench)
file(MAKE_DIRECTORY ${_bench_dir})
set(_bench $<TARGET_FILE:shardplan_cli> bench comm)
set(_small --sizes 8B:64KiB --factor 8 --iters 2 --warmup 1 --timeout-ms 60000)

# bench_expect(<name> <exit status> <regex> <env K=V|K=V or ""> <bench args...>)
function(bench_expect name rc regex env)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND} -DEXPECT_RC=${rc} "-DEXPECT_REGEX=${regex}" "-DENV=${env}"
      -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/bench/expect.cmake -- ${_bench} ${ARGN})
  set_tests_properties(${name} PROPERTIES TIMEOUT 60 LABELS bench)
endfunction()

# Every backend and reference, every collective, float32; writes the files
# the columns test reads.
add_test(NAME bench_comm_check
  COMMAND ${_bench} ${_small} --check --csv ${_bench_dir}/bench.csv --json ${_bench_dir}/bench.json)
set_tests_properties(bench_comm_check PROPERTIES TIMEOUT 120 LABELS bench FIXTURES_SETUP bench_comm_files)

add_test(NAME bench_comm_columns
  COMMAND ${CMAKE_COMMAND} -DDOC=${PROJECT_SOURCE_DIR}/docs/BENCHMARKS.md
    -DCSV=${_bench_dir}/bench.csv -DJSON=${_bench_dir}/bench.json -P ${CMAKE_CURRENT_LIST_DIR}/bench/columns.cmake)
set_tests_properties(bench_comm_columns PROPERTIES TIMEOUT 30 LABELS bench FIXTURES_REQUIRED bench_comm_files)

# Sums stay exact in the narrow dtypes; a rank count that is not a power of two.
foreach(dt float16 bfloat16 int8)
  add_test(NAME bench_comm_check_${dt}
    COMMAND ${_bench} --sizes 2B:4KiB --factor 32 --iters 1 --warmup 0 --check --dtype ${dt})
  set_tests_properties(bench_comm_check_${dt} PROPERTIES TIMEOUT 120 LABELS bench)
endforeach()
add_test(NAME bench_comm_check_3_ranks
  COMMAND ${_bench} --ranks 3 --sizes 8B:64KiB --factor 64 --iters 1 --warmup 0 --check)
set_tests_properties(bench_comm_check_3_ranks PROPERTIES TIMEOUT 120 LABELS bench)

# gloo-tcp: the gloo plugin with shm=off, its TCP path, in rows of its own
# next to gloo's (same-host shared memory); every collective, checked.
bench_expect(bench_comm_gloo_tcp 0 "gloo-tcp +plugin +2 processes, CPU buffers, option shm=off.* gloo +8 .* gloo-tcp +8 +2 +float32 +sum"
  "" --backends gloo,gloo-tcp --refs none --sizes 8B:4KiB --factor 512 --iters 2 --warmup 1 --check)

# --check counts what is wrong and fails the run (one rank spoils one
# element of each result it checks).
bench_expect(bench_comm_wrong_elements 1 "check found [1-9][0-9]* wrong elements" "SHARDPLAN_BENCH_CORRUPT=1"
  --backends local --refs none --collectives all_reduce,all_gather --sizes 64B --iters 1 --check)
# A rank that dies, or stops answering, ends its series with an error and
# exit status 1, not a hang. The message names every rank that failed by
# itself, so the one that died (status 3) is always there, whichever of it
# and its peer (failing on the closed connection) was reaped first.
bench_expect(bench_comm_rank_dies 1 "gloo failed: [^;]*(; )?rank 1 exited with status 3" "SHARDPLAN_BENCH_FAULT=1"
  --backends local,gloo --refs none ${_small})
bench_expect(bench_comm_rank_hangs 1 "gloo failed: rank 0 exited with status 1.*[Tt]imed out" "SHARDPLAN_BENCH_FAULT=1:hang"
  --backends gloo --refs none --sizes 8B:64B --iters 1 --timeout-ms 2000)
bench_expect(bench_comm_no_gnuplot 2 "needs gnuplot" "PATH=/nonexistent"
  --backends local --refs none --plot ${_bench_dir}/none.png)
bench_expect(bench_comm_bad_option 2 "unknown collective 'allreduce'" "" --collectives allreduce)
find_program(SHARDPLAN_GNUPLOT gnuplot)
if(SHARDPLAN_GNUPLOT)
  bench_expect(bench_comm_plot 0 "" "" --backends local --refs roofline --sizes 8B:4KiB --factor 8 --iters 1
    --plot ${_bench_dir}/bench.png)
endif()
# Sequence parallelism's activation memory (benchmarks/sp_memory), small: it
# runs, and the counts it prints are the ones docs/BENCHMARKS.md reads. (The
# benchmarks' directory is added after this one: the guards test the options
# that build them, not their targets, which do not exist yet here.)
set(_bench_models OFF)
if(SHARDPLAN_BUILD_BENCHMARKS AND SHARDPLAN_BUILD_EXAMPLES)
  set(_bench_models ON)
endif()
if(_bench_models)
  add_test(NAME bench_sp_memory_smoke COMMAND bench_sp_memory --config context=16,embed=32,heads=4,layers=1,mlp=64
    --batch 2 --ranks 1,2)
  set_tests_properties(bench_sp_memory_smoke PROPERTIES TIMEOUT 120
    PASS_REGULAR_EXPRESSION "2 +gpt_sp.yaml +[0-9]+ +[0-9.]+ +0\\.[0-9]+")
endif()
# Pipeline parallelism's figures (benchmarks/pipeline), tiny: every schedule
# at p = 2 and 4 as thread ranks and at p = 2 as gloo processes; --check 1
# fails unless the bytes between stages, the micro-batches in flight and the
# activation bytes kept are exactly what the schedule says.
if(_bench_models)
  set(_pipe_small --config context=8,embed=16,heads=2,layers=6,mlp=32 --batch 8 --micro 4,8 --steps 1 --check 1)
  add_test(NAME bench_pipeline_smoke COMMAND bench_pipeline --pipes 2,4 ${_pipe_small})
  add_test(NAME bench_pipeline_gloo_smoke COMMAND $<TARGET_FILE:shardplan_cli> launch -n 2 --backend gloo
    --timeout-ms 60000 -- $<TARGET_FILE:bench_pipeline> ${_pipe_small})
  set_tests_properties(bench_pipeline_smoke PROPERTIES PASS_REGULAR_EXPRESSION "\ninterleaved +4 +2 +8 .* exact\n")
  set_tests_properties(bench_pipeline_gloo_smoke PROPERTIES PASS_REGULAR_EXPRESSION "\n(\\[rank 0\\] )?interleaved +2 +2 +8 .* exact\n")
  set_tests_properties(bench_pipeline_smoke bench_pipeline_gloo_smoke PROPERTIES TIMEOUT 120 LABELS "bench;pipeline"
    FAIL_REGULAR_EXPRESSION "OFF:|error|figure is off")
endif()
# Async tensor parallelism's step timings (benchmarks/async_tp), tiny: every
# mode runs, gives the sync path's numbers, and (GPT) the communication replay
# moves the bytes of the sync step.
if(_bench_models)
  add_test(NAME bench_async_tp_pair_smoke COMMAND bench_async_tp --threads 2 --rounds 1 --steps 1 --sizes 64x32)
  add_test(NAME bench_async_tp_gpt_smoke COMMAND bench_async_tp --threads 2 --model gpt --layers 1 --rounds 1
    --steps 1 --sizes 64x64)
  set_tests_properties(bench_async_tp_pair_smoke bench_async_tp_gpt_smoke PROPERTIES TIMEOUT 120
    PASS_REGULAR_EXPRESSION "\n +64 +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ ")
  # benchmarks/async_tp/plot.sh draws what the bench prints (docs/async_tp_overlap.png).
  if(SHARDPLAN_GNUPLOT)
    add_test(NAME bench_async_tp_plot
      COMMAND sh -c "\"$1\" --threads 2 --rounds 1 --steps 1 --sizes 64x32,128x32 > \"$3/async_tp.txt\" && \"$2\" \"$3/async_tp.png\" \"local=$3/async_tp.txt\" && test -s \"$3/async_tp.png\""
        sh $<TARGET_FILE:bench_async_tp> ${PROJECT_SOURCE_DIR}/benchmarks/async_tp/plot.sh ${_bench_dir})
    set_tests_properties(bench_async_tp_plot PROPERTIES TIMEOUT 120 LABELS bench
      PASS_REGULAR_EXPRESSION "wrote .*async_tp.png")
  endif()
endif()
