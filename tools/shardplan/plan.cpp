// `shardplan plan`: runs bin/shardplan-plan from this program's directory.
// Checking a plan builds models and loads layer plugins, which need
// libtorch; exec'ing keeps that out of the launcher, which must start
// instantly.
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"

namespace shardplan_cli {

int plan_main(int argc, char** argv) {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = 0;
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  const std::string program = dir + "/shardplan-plan";
  std::vector<char*> args{const_cast<char*>(program.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(program.c_str(), args.data());
  std::fprintf(stderr, "shardplan plan: cannot run %s: %s (build or install the shardplan_plan target)\n",
               program.c_str(), ::strerror(errno));
  return 1;
}

}  // namespace shardplan_cli
