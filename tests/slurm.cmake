# The library under Slurm's own environment (issue 33, item 5): the variables
# Slurm 22.05 sets for the tasks of `srun -n 2`, `srun --ntasks-per-node 2`,
# `-c 1`, two nodes, sbatch's batch script, and MPI without --mpi=pmix,
# set by hand (tests/slurm/slurm_env_test.sh); no Slurm runs in CI.
set(_slurm_cases srun_n2 ntasks_per_node cpus_per_task two_nodes batch_script mpi_without_pmix)
foreach(case ${_slurm_cases})
  add_test(NAME slurm_env.${case}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/slurm/slurm_env_test.sh
      $<TARGET_FILE:fault_probe> $<TARGET_FILE:launcher_probe> ${case})
  set_tests_properties(slurm_env.${case} PROPERTIES TIMEOUT 120 LABELS "slurm;faults")
endforeach()
