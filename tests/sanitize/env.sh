# Sanitizer runtime settings for the build-asan tests (scripts/sanitize.sh).
# Source it to rerun one test by hand, e.g.
#   source tests/sanitize/env.sh; build-asan/bin/shardplan_tests --gtest_filter='Checkpoint*'
# Children started by the launcher or mpirun inherit these variables.
_shardplan_supp=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# halt_on_error: the first report ends the process (a rank that carried on
# could bury the report in its peers' errors). detect_leaks: on, with the
# suppressions in lsan.supp instead of turning leak checking off.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_init_order=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$_shardplan_supp/ubsan.supp"
export LSAN_OPTIONS="suppressions=$_shardplan_supp/lsan.supp:print_suppressions=0"
unset _shardplan_supp
