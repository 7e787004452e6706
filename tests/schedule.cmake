# The example trainers' lr schedule (--warmup, --lr-min; examples/models/schedule.h).
if(TARGET train_gpt)
  # Issue 34, item 4: {data: 2, model: 2}, ZeRO-1, --micro-batches 2, --clip, saved
  # and resumed mid-warmup and mid-decay: the uninterrupted run's losses
  # (1e-12, float64), norms and lrs; bfloat16 with masters and a loss scaler
  # resumed alike; other settings refused unless overridden.
  add_test(NAME e2e_schedule_resume_2d_zero
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/e2e/schedule_resume.sh $<TARGET_FILE:train_gpt> ${PROJECT_SOURCE_DIR}/plans)
  set_tests_properties(e2e_schedule_resume_2d_zero PROPERTIES TIMEOUT 300 LABELS "ckpt;data_parallel")
endif()
if(TARGET train_model)
  # Bad schedule options: one line naming the option, before anything runs.
  set(_sched_bad
    "warmup_steps|--warmup,10,--steps,10|--warmup 10 leaves no step after it: it must be less than --steps 10"
    "lr_min_negative|--lr-min,-1e-4|--lr-min -0.0001 must be from 0 to --lr 0.002"
    "lr_min_above_lr|--lr-min,0.01,--lr,0.001|--lr-min 0.01 must be from 0 to --lr 0.001"
    "lr_min_nan|--lr-min,nan|bad value for --lr-min: 'nan'"
    "override_alone|--override-schedule|--override-schedule takes effect with --load DIR or --resume auto only")
  foreach(case IN LISTS _sched_bad)
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 name)
    list(GET parts 1 args)
    list(GET parts 2 why)
    string(REPLACE "," ";" args "${args}")
    string(REGEX REPLACE "([.()+*?])" "\\\\\\1" why_re "${why}")
    add_test(NAME e2e_schedule_bad_${name} COMMAND train_model ${args})
    set_tests_properties(e2e_schedule_bad_${name} PROPERTIES PASS_REGULAR_EXPRESSION "^train_model: ${why_re}\n"
      TIMEOUT 60)
  endforeach()
endif()
