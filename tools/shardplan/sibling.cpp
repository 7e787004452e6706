// Subcommands whose work needs libtorch, plugins, gloo or MPI (bench, plan,
// ckpt) live in separate programs installed next to this one; exec'ing them
// keeps all of that out of `shardplan launch`, which must start instantly.
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"

namespace shardplan_cli {

int exec_sibling(const char* command, const char* program_name, const char* target, int argc, char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = 0;
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string program = dir + "/" + program_name;
  std::vector<char*> args{const_cast<char*>(program.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(program.c_str(), args.data());
  std::fprintf(stderr, "shardplan %s: cannot run %s: %s (build or install the %s target)\n", command,
               program.c_str(), ::strerror(errno), target);
  return 1;
}

int bench_main(int argc, char** argv) { return exec_sibling("bench", "shardplan-bench", "shardplan_bench", argc, argv); }
int plan_main(int argc, char** argv) { return exec_sibling("plan", "shardplan-plan", "shardplan_plan", argc, argv); }
int ckpt_main(int argc, char** argv) { return exec_sibling("ckpt", "shardplan-ckpt", "shardplan_ckpt", argc, argv); }

}  // namespace shardplan_cli
