# Pipeline parallelism in the example trainer (issue 36): the GPT trained
# with plans/gpt_pipe.yaml ({pipe: 2}, 1F1B) and plans/gpt_pipe_2d.yaml
# ({pipe: 2, model: 2}: tensor parallelism inside each stage) and
# plans/gpt_pipe_3d.yaml ({data: 2, pipe: 2, model: 2}), and {data: 2, pipe:
# 2} with ZeRO-1, and {pipe: 2} with GPipe and interleaved, prints one
# unsharded process's losses (and with --clip its norms), float64, to 1e-10
# relative; as threads and as gloo processes. With sequence parallelism and
# async tensor parallelism in the stages, --micro-batches, --clip under
# ZeRO-1/2, bfloat16 with float32 masters and a loss scaler, MPI, and dropout
# (schedule- and backend-independent, replicas kept). And an
# option it does not take yet is refused.
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
  # The 3-D mesh as 8 gloo processes: data, pipe and model groups over the
  # real transport.
  add_test(NAME e2e_pipeline_gpt_3d_gloo8_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gloo} 8 -- ${_gpt} --plan ${_p}/gpt_pipe_3d.yaml)
  set_tests_properties(e2e_pipeline_gpt_3d_gloo8_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
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
  # Dropout (0.1): not one process's masks (a micro-batch draws its own
  # shape), but each stage's own streams drawn in micro-batch order, so
  # GPipe and 1F1B train alike, threads and gloo processes alike, and the
  # model ranks of a stage keep their replicas (--check-replicas 1).
  set(_gpt_drop $<TARGET_FILE:train_gpt> --steps 4 --log-every 1 --batch 8 --dtype float64 --optimizer adam --lr 0.01
    --config context=16,embed=32,mlp=64,heads=4,layers=2,dropout=0.1)
  add_test(NAME e2e_pipeline_gpt_dropout_schedules_threads2_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt_drop} --ranks 2 --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_gpipe.yaml
    -- ${_gpt_drop} --ranks 2 --plan ${_p}/gpt_pipe.yaml)
  add_test(NAME e2e_pipeline_gpt_dropout_2d_gloo4_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt_drop} --ranks 4 --plan ${_p}/gpt_pipe_2d.yaml
    -- ${_gloo} 4 -- ${_gpt_drop} --check-replicas 1 --plan ${_p}/gpt_pipe_2d.yaml)
  set_tests_properties(e2e_pipeline_gpt_dropout_schedules_threads2_f64 e2e_pipeline_gpt_dropout_2d_gloo4_f64
    PROPERTIES TIMEOUT 300 LABELS pipeline)
  # --clip: the norm over every stage, printed and applied as one process's.
  add_test(NAME e2e_pipeline_gpt_3d_clip_threads8_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.5
    -- ${_gpt} --clip 0.5 -- ${_gpt} --clip 0.5 --ranks 8 --plan ${_p}/gpt_pipe_3d.yaml)
  # Checkpoints: saved by {data: 2, pipe: 2, model: 2}, resumed (--resume
  # auto) at {pipe: 2}, {model: 2}, unsharded and {pipe: 2} on gloo.
  add_test(NAME e2e_pipeline_ckpt_resume_gloo
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/ckpt_pipeline.sh $<TARGET_FILE:shardplan_cli> $<TARGET_FILE:train_gpt> ${_p})
  set_tests_properties(e2e_pipeline_ckpt_resume_gloo PROPERTIES TIMEOUT 300 LABELS "pipeline;ckpt")
  # Sequence parallelism inside each stage (plans/gpt_pipe_sp.yaml: the
  # boundary activation is each model rank's part of the sequence) and async
  # tensor parallelism (plans/gpt_async.yaml's rings inside a 2-stage
  # pipeline), threads and gloo processes.
  file(READ ${_p}/gpt_async.yaml _plan)
  string(REPLACE "mesh: {model: auto}" "mesh: {pipe: 2, model: 2}\npipeline: {schedule: gpipe, micro_batches: 2}"
    _async "${_plan}")
  if(_async STREQUAL _plan)
    message(FATAL_ERROR "plans/gpt_async.yaml changed: tests/e2e_pipeline.cmake finds no mesh line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_async.yaml "${_async}")
  add_test(NAME e2e_pipeline_gpt_sp_threads4_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gpt} --check-replicas 1 --ranks 4 --plan ${_p}/gpt_pipe_sp.yaml)
  add_test(NAME e2e_pipeline_gpt_async_gloo4_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gloo} 4 -- ${_gpt} --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_async.yaml)
  # All at once: {data: 2, pipe: 2, model: 2} with sequence parallelism,
  # --micro-batches 2, --clip and the replicas checked every step.
  file(READ ${_p}/gpt_pipe_sp.yaml _plan)
  string(REPLACE "mesh: {pipe: 2, model: 2}" "mesh: {data: 2, pipe: 2, model: 2}" _sp3d "${_plan}")
  if(_sp3d STREQUAL _plan)
    message(FATAL_ERROR "plans/gpt_pipe_sp.yaml changed: tests/e2e_pipeline.cmake finds no mesh line to edit")
  endif()
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_sp_3d.yaml "${_sp3d}")
  set(_gpt16 $<TARGET_FILE:train_gpt> --steps 4 --log-every 1 --batch 16 --dtype float64 --optimizer adam --lr 0.01
    --config context=16,embed=32,mlp=64,heads=4,layers=2 --clip 0.5)
  add_test(NAME e2e_pipeline_gpt_sp_3d_accumulate_clip_threads8_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.5
    -- ${_gpt16} -- ${_gpt16} --micro-batches 2 --check-replicas 1 --ranks 8
    --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_sp_3d.yaml)
  set_tests_properties(e2e_pipeline_gpt_sp_3d_accumulate_clip_threads8_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
  # --micro-batches 2: two pipeline steps of 4 samples each, the data axis
  # reduced once; --clip under ZeRO-1 and ZeRO-2 (the norm over the stages'
  # slices).
  add_test(NAME e2e_pipeline_gpt_3d_accumulate_threads8_f64 COMMAND ${_e2e} 1e-10
    -- ${_gpt} -- ${_gpt} --micro-batches 2 --ranks 8 --plan ${_p}/gpt_pipe_3d.yaml)
  string(REPLACE "{zero: 1}" "{zero: 2}" _zero2 "${_zero}")
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_data_zero2.yaml "${_zero2}")
  foreach(zero 1 2)
    add_test(NAME e2e_pipeline_gpt_data_zero${zero}_clip_threads4_f64 COMMAND ${_e2e} 1e-10 --norms-above 0.5
      -- ${_gpt} --clip 0.5 -- ${_gpt} --clip 0.5 --micro-batches 2 --ranks 4
      --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_data_zero${zero}.yaml)
    set_tests_properties(e2e_pipeline_gpt_data_zero${zero}_clip_threads4_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
  endforeach()
  # bfloat16 with float32 masters, and a dynamic loss scaler (its skip
  # decision the same on every rank of every stage), within the unsharded
  # run's own bfloat16 spread (tests/e2e_precision.cmake's bound).
  set(_gpt_bf16 $<TARGET_FILE:train_gpt> --steps 20 --log-every 1 --batch 8 --config context=16,embed=32,mlp=64)
  add_test(NAME e2e_pipeline_gpt_bf16_masters_threads4 COMMAND ${_e2e} bfloat16 -- ${_gpt_bf16}
    -- ${_gpt_bf16} --dtype bfloat16 --ranks 4 --plan ${_p}/gpt_pipe_2d.yaml)
  add_test(NAME e2e_pipeline_gpt_bf16_loss_scale_threads4 COMMAND ${_e2e} bfloat16 -- ${_gpt_bf16} --clip 1
    -- ${_gpt_bf16} --dtype bfloat16 --loss-scale dynamic --clip 1 --ranks 4
    --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_data_zero1.yaml)
  set_tests_properties(e2e_pipeline_gpt_sp_threads4_f64 e2e_pipeline_gpt_async_gloo4_f64
    e2e_pipeline_gpt_3d_accumulate_threads8_f64 e2e_pipeline_gpt_bf16_masters_threads4
    e2e_pipeline_gpt_bf16_loss_scale_threads4 PROPERTIES TIMEOUT 300 LABELS pipeline)
  # The MPI backend (where mpirun is): {pipe: 2} as 2 processes.
  find_program(_pipeline_mpirun NAMES mpirun mpiexec)
  if(TARGET shardplan_comm_mpi AND _pipeline_mpirun)
    add_test(NAME e2e_pipeline_gpt_mpi2_f64 COMMAND ${_e2e} 1e-10
      -- ${_gpt} -- $<TARGET_FILE:shardplan_cli> launch --backend mpi -n 2 -- ${_gpt} --plan ${_p}/gpt_pipe.yaml)
    set_tests_properties(e2e_pipeline_gpt_mpi2_f64 PROPERTIES TIMEOUT 300 LABELS "pipeline;mpi")
  endif()
  # A batch the micro-batches do not divide: one line at the plan's
  # micro_batches (plans/gpt_pipe.yaml: 4 of them; --batch 6).
  add_test(NAME e2e_pipeline_refuses_batch_micro_batches_do_not_divide COMMAND $<TARGET_FILE:train_gpt> --ranks 2
    --steps 1 --batch 6 --config context=16,embed=32,mlp=64,heads=4 --plan ${_p}/gpt_pipe.yaml)
  set_tests_properties(e2e_pipeline_refuses_batch_micro_batches_do_not_divide PROPERTIES LABELS pipeline
    PASS_REGULAR_EXPRESSION "gpt_pipe.yaml:[0-9]+:[0-9]+: --batch 6 does not divide into 1 --micro-batches x 1 data rank\\(s\\) x these 4 micro_batches"
    FAIL_REGULAR_EXPRESSION "step +1 ")
  add_test(NAME e2e_pipeline_refuses_clip_with_torch COMMAND $<TARGET_FILE:train_gpt> --ranks 2 --steps 1 --clip 1
    --clip-with torch --config context=16,embed=32,mlp=64,heads=4 --plan ${_p}/gpt_pipe.yaml)
  set_tests_properties(e2e_pipeline_refuses_clip_with_torch PROPERTIES
    PASS_REGULAR_EXPRESSION "--clip-with torch: not yet with a plan's pipeline: key" TIMEOUT 120 LABELS pipeline)
  set_tests_properties(e2e_pipeline_gpt_threads2_f64 e2e_pipeline_gpt_2d_threads4_f64 e2e_pipeline_gpt_gloo2_f64
    e2e_pipeline_gpt_3d_threads8_f64 e2e_pipeline_gpt_data_zero1_gloo4_f64 e2e_pipeline_gpt_3d_clip_threads8_f64
    PROPERTIES TIMEOUT 300 LABELS pipeline)
endif()

# The example Llama (train_model --model llama), its head untied and tied to
# the embedding (the copies' gradients summed between the first stage and
# the last): plans/llama_pipe.yaml ({pipe: 2}, 1F1B; edited to GPipe and to
# interleaved, and to {pipe: 4}), {pipe: 2, model: 2} (plans/llama.yaml's
# rules in each stage), plans/llama_pipe_3d.yaml ({data: 2, pipe: 2,
# model: 2}, 8 ranks), plans/llama_pipe_sp.yaml (sequence parallelism) and
# plans/llama_async.yaml in a pipeline; threads and gloo processes; and
# --micro-batches with the tie. Each prints one process's losses (float64,
# 1e-10).
if(TARGET train_model AND TARGET shardplan_cli)
  # A model that cannot be cut: one line at the plan's pipeline: key.
  add_test(NAME e2e_pipeline_refuses_uncut_model COMMAND $<TARGET_FILE:train_model> --model lstm_lm --ranks 2
    --steps 1 --plan ${PROJECT_SOURCE_DIR}/plans/gpt_pipe.yaml)
  set_tests_properties(e2e_pipeline_refuses_uncut_model PROPERTIES LABELS pipeline PASS_REGULAR_EXPRESSION
    "gpt_pipe.yaml:13:3: pipeline: model lstm_lm does not declare its pieces" FAIL_REGULAR_EXPRESSION "step +1 ")
  # Fine-tuning from weights on disk (--load-weights), pipelined.
  add_test(NAME e2e_pipeline_llama_load_weights COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/pipeline_load_weights.sh
    $<TARGET_FILE:train_model> ${PROJECT_SOURCE_DIR}/plans ${CMAKE_CURRENT_BINARY_DIR}/pipeline_load_weights
    ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set_tests_properties(e2e_pipeline_llama_load_weights PROPERTIES TIMEOUT 300 LABELS pipeline)
  set(_e2e ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh)
  set(_gloo $<TARGET_FILE:shardplan_cli> launch --backend gloo -n)
  set(_p ${PROJECT_SOURCE_DIR}/plans)
  set(_b ${CMAKE_CURRENT_BINARY_DIR})
  set(_cfg context=16,embed=32,heads=4,kv_heads=2,layers=2,mlp=64)
  foreach(tie 0 1)
    set(_llama${tie} $<TARGET_FILE:train_model> --model llama --steps 4 --log-every 1 --batch 8 --dtype float64
      --optimizer adam --lr 0.01 --config ${_cfg},tie=${tie})
  endforeach()
  file(READ ${_p}/llama_pipe.yaml _plan)
  set(_edits "gpipe|schedule: gpipe" "interleaved|schedule: interleaved\n  virtual_stages: 2" "pipe4|schedule: 1f1b")
  foreach(edit ${_edits})
    string(REPLACE "|" ";" edit "${edit}")
    list(GET edit 0 kind)
    list(GET edit 1 with)
    string(REGEX REPLACE "schedule: 1f1b[^\n]*" "${with}" _edited "${_plan}")
    if(kind STREQUAL pipe4)
      string(REPLACE "mesh: {pipe: 2}" "mesh: {pipe: 4}" _edited "${_edited}")
    endif()
    if(_edited STREQUAL _plan AND NOT kind STREQUAL pipe4)
      message(FATAL_ERROR "plans/llama_pipe.yaml changed: tests/e2e_pipeline.cmake finds no line to edit")
    endif()
    file(WRITE ${_b}/llama_pipe_${kind}.yaml "${_edited}")
  endforeach()
  foreach(src llama llama_async)
    file(READ ${_p}/${src}.yaml _plan)
    string(REPLACE "mesh: {model: auto}" "mesh: {pipe: 2, model: 2}\npipeline: {schedule: 1f1b, micro_batches: 2}"
      _edited "${_plan}")
    if(_edited STREQUAL _plan)
      message(FATAL_ERROR "plans/${src}.yaml changed: tests/e2e_pipeline.cmake finds no mesh line to edit")
    endif()
    file(WRITE ${_b}/${src}_pipe_2d.yaml "${_edited}")
  endforeach()
  set(_tests
    "threads2|0|--ranks 2 --plan ${_p}/llama_pipe.yaml"
    "tied_gloo2|1|GLOO 2 -- TRAIN --plan ${_p}/llama_pipe.yaml"
    "tied_gpipe_threads2|1|--ranks 2 --plan ${_b}/llama_pipe_gpipe.yaml"
    "tied_interleaved_threads2|1|--ranks 2 --plan ${_b}/llama_pipe_interleaved.yaml"
    "tied_pipe4_threads4|1|--ranks 4 --plan ${_b}/llama_pipe_pipe4.yaml"
    "2d_threads4|0|--ranks 4 --plan ${_b}/llama_pipe_2d.yaml"
    "tied_2d_gloo4|1|GLOO 4 -- TRAIN --plan ${_b}/llama_pipe_2d.yaml"
    "tied_3d_threads8|1|--check-replicas 1 --ranks 8 --plan ${_p}/llama_pipe_3d.yaml"
    "3d_threads8|0|--ranks 8 --plan ${_p}/llama_pipe_3d.yaml"
    "tied_sp_threads4|1|--check-replicas 1 --ranks 4 --plan ${_p}/llama_pipe_sp.yaml"
    "async_threads4|0|--ranks 4 --plan ${_b}/llama_async_pipe_2d.yaml"
    "tied_accumulate_threads2|1|--micro-batches 2 --ranks 2 --plan ${_p}/llama_pipe.yaml")
  foreach(t ${_tests})
    string(REPLACE "|" ";" t "${t}")
    list(GET t 0 name)
    list(GET t 1 tie)
    list(GET t 2 args)
    separate_arguments(args UNIX_COMMAND "${args}")
    if("TRAIN" IN_LIST args)  # the gloo launcher first, then the trainer
      list(REMOVE_AT args 0)
      list(INSERT args 0 ${_gloo})
      list(TRANSFORM args REPLACE "^TRAIN$" "$<TARGET_FILE:train_model>")
      list(FIND args "--" _at)
      math(EXPR _at "${_at} + 2")
      list(INSERT args ${_at} --model llama --steps 4 --log-every 1 --batch 8 --dtype float64 --optimizer adam
        --lr 0.01 --config ${_cfg},tie=${tie})
      add_test(NAME e2e_pipeline_llama_${name}_f64 COMMAND ${_e2e} 1e-10 -- ${_llama${tie}} -- ${args})
    else()
      add_test(NAME e2e_pipeline_llama_${name}_f64 COMMAND ${_e2e} 1e-10 -- ${_llama${tie}} -- ${_llama${tie}} ${args})
    endif()
    set_tests_properties(e2e_pipeline_llama_${name}_f64 PROPERTIES TIMEOUT 300 LABELS pipeline)
  endforeach()
  # bfloat16 with float32 masters and a loss scaler, the tied Llama with
  # sequence parallelism in its stages, within the unsharded bfloat16 spread.
  set(_llama_bf16 $<TARGET_FILE:train_model> --model llama --steps 20 --log-every 1 --batch 8 --config ${_cfg},tie=1)
  add_test(NAME e2e_pipeline_llama_tied_sp_bf16_loss_scale_threads4 COMMAND ${_e2e} bfloat16 -- ${_llama_bf16}
    -- ${_llama_bf16} --dtype bfloat16 --loss-scale dynamic --ranks 4 --plan ${_p}/llama_pipe_sp.yaml)
  set_tests_properties(e2e_pipeline_llama_tied_sp_bf16_loss_scale_threads4 PROPERTIES TIMEOUT 300 LABELS pipeline)
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
  # The trainer passes its first batch as the sample: the timed cut trains
  # to one process's losses.
  if(TARGET train_gpt)
    set(_gpt $<TARGET_FILE:train_gpt> --steps 4 --log-every 1 --batch 8 --dtype float64 --optimizer adam --lr 0.01
      --config context=16,embed=32,mlp=64,heads=4,layers=2)
    add_test(NAME e2e_pipeline_gpt_timed_stages_threads2_f64 COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/losses_match.sh
      1e-10 -- ${_gpt} -- ${_gpt} --ranks 2 --plan ${CMAKE_CURRENT_BINARY_DIR}/gpt_pipe_timed.yaml)
    set_tests_properties(e2e_pipeline_gpt_timed_stages_threads2_f64 PROPERTIES TIMEOUT 120 LABELS pipeline)
  endif()
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
