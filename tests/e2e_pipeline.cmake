# Pipeline parallelism in the example trainer (issue 36): the GPT trained
# with plans/gpt_pipe.yaml ({pipe: 2}, 1F1B) and plans/gpt_pipe_2d.yaml
# ({pipe: 2, model: 2}: tensor parallelism inside each stage) and
# plans/gpt_pipe_3d.yaml ({data: 2, pipe: 2, model: 2}), and {data: 2, pipe:
# 2} with ZeRO-1, and {pipe: 2} with GPipe and interleaved, prints one
# unsharded process's losses (and with --clip its norms), float64, to 1e-10
# relative; as threads and as gloo processes. And an option it does not
# take yet is refused.
if(TARGET train_gpt AND TARGET shardplan_cli)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  set(_gpt $<TARGET_FILE:train_gpt> --steps 4 --log-every 1 --batch 8 --dtype float64 --optimizer adam --lr 0.01
    --config context=16,embed=32,mlp=64,heads=4,layers=2)
  set(_p ${PROJECT_SOURCE_DIR}/plans)
  add_test(NAME e2e_pipeline_gpt_threads2_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gpt} --ranks 2 --plan ${_p}/gpt_pipe.yaml)
  add_test(NAME e2e_pipeline_gpt_2d_threads4_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gpt} --ranks 4 --plan ${_p}/gpt_pipe_2d.yaml)
  add_test(NAME e2e_pipeline_gpt_gloo2_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gloo} 2 -- ${_gpt} --plan ${_p}/gpt_pipe.yaml)
  add_test(NAME e2e_pipeline_gpt_3d_threads8_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gpt} --ranks 8 --plan ${_p}/gpt_pipe_3d.yaml)
  # ZeRO-1 over the data axis: shardplan::Optimizer over the stage's DataParallel.
  file(READ ${_p}/gpt_pipe_3d.yaml _plan)
  string(REPLACE "mesh: {data: 2, pipe: 2, model: 2}" "mesh: {data: 2, pipe: 2}\ndata_parallel: {zero: 1}" _zero
    "${_plan}")
  string(REGEX REPLACE "\nrules:.*" "\nrules: []\n" _zero "${_zero}")
  if(_zero STREQUAL _plan)
    message(FATAL_ERROR "plans/gpt_pipe_3d.yaml changed: tests/e2e_pipeline.cmake finds no mesh line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_data_zero1.yaml "${_zero}")
  add_test(NAME e2e_pipeline_gpt_data_zero1_gloo4_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gloo} 4 -- ${_gpt} --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_data_zero1.yaml)
  # The other schedules: GPipe, and interleaved with 2 model chunks per rank
  # (the GPT's 4 pieces as 4 model stages on 2 ranks).
  file(READ ${_p}/gpt_pipe.yaml _plan)
  foreach(kind gpipe interleaved)
    set(_with "schedule: ${kind}")
    if(kind STREQUAL interleaved)
      set(_with "schedule: interleaved\n  virtual_stages: 2")
    endif()
    string(REGEX REPLACE "schedule: 1f1b[^\n]*" "${_with}" _edited "${_plan}")
    if(_edited STREQUAL _plan)
      message(FATAL_ERROR "plans/gpt_pipe.yaml changed: tests/e2e_pipeline.cmake finds no schedule line to edit")
    endif()
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_${kind}.yaml "${_edited}")
    add_test(NAME e2e_pipeline_gpt_${kind}_threads2_f64 COMMAND ${_e2e} 1e-10
      -- ${_gpt} -- ${_gpt} --ranks 2 --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_${kind}.yaml)
    set_tests_properties(e2e_pipeline_gpt_${kind}_threads2_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
  endforeach()
  # --clip: the norm over every stage, printed and applied as one process's.
  add_test(NAME e2e_pipeline_gpt_3d_clip_threads8_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.5
    -- ${_gpt} --clip 0.5 -- ${_gpt} --clip 0.5 --ranks 8 --plan ${_p}/gpt_pipe_3d.yaml)
  add_test(NAME e2e_pipeline_refuses_clip_with_torch COMMAND $<TARGET_FILE:train_gpt> --ranks 2 --steps 1 --clip 1
    --clip-with torch --config context=16,embed=32,mlp=64,heads=4 --plan ${_p}/gpt_pipe.yaml)
  set_tests_properties(e2e_pipeline_refuses_clip_with_torch PROPERTIES
    PASS_REGULAR_EXPRESSION "--clip-with torch: not yet with a plan's pipeline: key" TIMEOUT 120 LABELS pipeline)
  set_tests_properties(e2e_pipeline_gpt_threads2_f64 e2e_pipeline_gpt_2d_threads4_f64 e2e_pipeline_gpt_gloo2_f64
    e2e_pipeline_gpt_3d_threads8_f64 e2e_pipeline_gpt_data_zero1_gloo4_f64 e2e_pipeline_gpt_3d_clip_threads8_f64
    PROPERTIES TIMEOUT 300 LABELS pipeline)
endif()

# `shardplan plan check` on a pipelined plan: the stages, their bytes and the
# predicted bubble; a model that does not declare its pieces is refused at
# the pipeline key's line.
if(TARGET shardplan_plan AND TARGET shardplan_cli)
  add_test(NAME plan_check_pipeline_stages COMMAND $<TARGET_FILE:shardplan_cli> plan check
    ${PROJECT_SOURCE_DIR}/plans/gpt_pipe_3d.yaml --model gpt --world 8 --no-comm)
  set_tests_properties(plan_check_pipeline_stages PROPERTIES TIMEOUT 120 LABELS pipeline PASS_REGULAR_EXPRESSION
    "predicted bubble 0.333\nnote: pipeline stage 0: pieces 0-1 \\(tok_emb, pos_emb, blocks.0\\), 496384 parameter bytes")
  add_test(NAME plan_check_pipeline_refuses_uncut_model COMMAND $<TARGET_FILE:shardplan_cli> plan check
    ${PROJECT_SOURCE_DIR}/plans/gpt_pipe.yaml --model lstm_lm --world 2 --no-comm)
  set_tests_properties(plan_check_pipeline_refuses_uncut_model PROPERTIES TIMEOUT 120 LABELS pipeline
    PASS_REGULAR_EXPRESSION "gpt_pipe.yaml:13:3: pipeline: the model does not declare its pieces")
endif()

# `stages: {auto: time}`: plan check says the run will time the pieces (the
# cut it shows is by parameters). The plan is plans/gpt_pipe.yaml with its
# stages line changed, written here.
if(TARGET shardplan_plan AND TARGET shardplan_cli)
  file(READ ${PROJECT_SOURCE_DIR}/plans/gpt_pipe.yaml _timed)
  string(REPLACE "stages: auto " "stages: {auto: time} " _timed_new "${_timed}")
  if(_timed_new STREQUAL _timed)
    message(FATAL_ERROR "plans/gpt_pipe.yaml changed: tests/e2e_pipeline.cmake finds no stages line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_timed.yaml "${_timed_new}")
  add_test(NAME plan_check_pipeline_timed_stages COMMAND $<TARGET_FILE:shardplan_cli> plan check
    ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_timed.yaml --model gpt --world 2 --no-comm)
  set_tests_properties(plan_check_pipeline_timed_stages PROPERTIES TIMEOUT 120 LABELS pipeline PASS_REGULAR_EXPRESSION
    "pipeline stages \\{auto: time\\}: when the run starts, every rank times each piece's forward")
endif()

# Interleaved over gloo and MPI processes: its chunks have two ranks send to
# each other and then receive, which waited forever while the plugins queued
# a blocking receive behind the rank's earlier sends (their point_to_point
# now waits for it at once).
if(TARGET train_gpt AND TARGET shardplan_cli)
  add_test(NAME e2e_pipeline_gpt_interleaved_gloo2_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gloo} 2 -- ${_gpt} --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_interleaved.yaml)
  set_tests_properties(e2e_pipeline_gpt_interleaved_gloo2_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
  find_program(SHARDPLAN_MPIRUN NAMES mpirun mpiexec)
  if(TARGET shardplan_comm_mpi AND SHARDPLAN_MPIRUN)
    add_test(NAME e2e_pipeline_gpt_interleaved_mpi2_f64 COMMAND ${_e2e} 1e-10
      -- ${_gpt} -- $<TARGET_FILE:shardplan_cli> launch --backend mpi -n 2 --timeout-ms 60000
      -- ${_gpt} --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_interleaved.yaml)
    set_tests_properties(e2e_pipeline_gpt_interleaved_mpi2_f64 PROPERTIES TIMEOUT 300 LABELS "pipeline;mpi")
  endif()
endif()
