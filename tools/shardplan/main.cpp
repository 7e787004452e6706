// `shardplan`: the command-line tool. This file only dispatches; every
// subcommand lives in its own file, so what one of them needs (libtorch, a
// plan parser, ...) can be kept out of the others. `launch` in particular
// must stay torch-free: it starts before, and outlives, every rank.
#include <cstdio>
#include <cstring>
#include <string>

#include "commands.h"

#ifndef SHARDPLAN_VERSION_STRING
#define SHARDPLAN_VERSION_STRING "unknown"
#endif

namespace {

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

const Command kCommands[] = {
    {"launch", "start the ranks of a job on this node as processes (torchrun-style)",
     shardplan_cli::launch_main},
    {"bench", "benchmark suites, e.g. 'bench comm': every comm backend side by side", shardplan_cli::bench_main},
    {"plan",
     "'plan check': what a plan does to a model (shapes, errors, bytes) before running it; "
     "'plan auto': a plan written for it",
     shardplan_cli::plan_main},
    {"ckpt", "sharded checkpoints: 'ckpt convert' (to M ranks, or one plain file), 'ckpt inspect'",
     shardplan_cli::ckpt_main},
};

void print_usage(FILE* out) {
  std::fprintf(out,
               "usage: shardplan <command> [options]\n"
               "       shardplan help <command>\n"
               "       shardplan --version\n"
               "\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out, "\nRun 'shardplan <command> --help' for the options of a command.\n");
}

const Command* find_command(const char* name) {
  for (const Command& c : kCommands)
    if (std::strcmp(c.name, name) == 0) return &c;
  return nullptr;
}

int unknown_command(const char* name) {
  std::fprintf(stderr, "shardplan: unknown command '%s' (try 'shardplan --help')\n", name);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "shardplan: missing command (try 'shardplan --help')\n");
    return 2;
  }
  const std::string first = argv[1];
  if (first == "-h" || first == "--help") {
    print_usage(stdout);
    return 0;
  }
  if (first == "help") {
    if (argc < 3) {
      print_usage(stdout);
      return 0;
    }
    const Command* c = find_command(argv[2]);
    if (!c) return unknown_command(argv[2]);
    char help_flag[] = "--help";
    char* sub_argv[] = {argv[2], help_flag, nullptr};
    return c->run(2, sub_argv);
  }
  if (first == "-V" || first == "--version") {
    std::printf("shardplan %s\n", SHARDPLAN_VERSION_STRING);
    return 0;
  }
  if (const Command* c = find_command(argv[1])) return c->run(argc - 1, argv + 1);
  return unknown_command(argv[1]);
}
