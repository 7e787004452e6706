# The PyTorch reference of the GPT example (benchmarks/gpt_peer): a few steps
# of train_gpt over gloo and of the same model in Python with
# ProcessGroupGloo, 2 processes each through `shardplan launch`. The driver
# fails when the two sides' losses differ or when they communicate different
# bytes or calls; it exits 77 (a skip) where Debian's python3-torch is missing
# (scripts/setup-deps.sh installs it, so CI runs it).
find_program(SHARDPLAN_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
if(SHARDPLAN_SYSTEM_PYTHON3)
  add_test(NAME gpt_peer_smoke
    COMMAND ${SHARDPLAN_SYSTEM_PYTHON3} ${PROJECT_SOURCE_DIR}/benchmarks/gpt_peer/side_by_side.py
      --build ${CMAKE_BINARY_DIR} --reps 1 --steps 6 --log-every 2 --batch 8 --skip-status 77)
  set_tests_properties(gpt_peer_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "gloo;bench")
endif()
# The same for data parallelism against torch's DistributedDataParallel, in
# float64 where both sides' losses agree to the last printed digit.
if(SHARDPLAN_SYSTEM_PYTHON3)
  add_test(NAME gpt_peer_ddp_smoke
    COMMAND ${SHARDPLAN_SYSTEM_PYTHON3} ${PROJECT_SOURCE_DIR}/benchmarks/gpt_peer/side_by_side.py
      --build ${CMAKE_BINARY_DIR} --ddp --dtype float64 --max-loss-diff 1e-11 --reps 1 --steps 6 --log-every 2
      --batch 8 --skip-status 77)
  set_tests_properties(gpt_peer_ddp_smoke PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS "gloo;bench")
endif()
# The timeline tools (benchmarks/gpt_peer/timeline.py, timeline_summary.py):
# the summary's numbers on a made-up trace pair, and the peer's trace lines
# from 2 gloo processes (its torch part skipped without python3-torch).
if(SHARDPLAN_SYSTEM_PYTHON3)
  add_test(NAME gpt_peer_timeline COMMAND ${SHARDPLAN_SYSTEM_PYTHON3} ${PROJECT_SOURCE_DIR}/tests/gpt_peer/test_timeline.py)
  set_tests_properties(gpt_peer_timeline PROPERTIES TIMEOUT 120 LABELS "gloo;bench")
endif()
