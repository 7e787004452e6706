#pragma once
// Subcommands of the `shardplan` tool, one per source file; main.cpp
// dispatches to them. Each takes its own argv (argv[0] is the subcommand
// name) and returns the process exit status: 0 success, 1 failure, 2 usage
// error.

namespace shardplan_cli {

int launch_main(int argc, char** argv);
int bench_main(int argc, char** argv);
int plan_main(int argc, char** argv);
int ckpt_main(int argc, char** argv);

// Runs `program_name` from this program's directory with argv[1..]; returns
// only when it cannot be run (after saying so, naming the build `target`).
int exec_sibling(const char* command, const char* program_name, const char* target, int argc, char** argv);

}  // namespace shardplan_cli
