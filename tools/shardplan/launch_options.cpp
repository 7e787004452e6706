// `shardplan launch`'s command line: usage text, options, the program check.
#include "launch_internal.h"
#include "shardplan/count_option.h"

namespace shardplan_cli {
namespace launcher {

const char* const kUsage =
    "usage: shardplan launch -n N [options] [--] program [args...]\n"
    "\n"
    "Starts N processes of `program` on this node, one per rank, with the\n"
    "environment torchrun gives its workers; prints their output line by line as\n"
    "'[rank K] line'; stops every rank as soon as one fails. Run one launcher per\n"
    "node for a multi-node job.\n"
    "\n"
    "options:\n"
    "  -n, --nproc-per-node N  ranks on this node (required)\n"
    "      --nnodes M          nodes in the job (default 1)\n"
    "      --node-rank K       index of this node, 0..M-1 (default 0)\n"
    "      --master-addr A     address of node 0, where rank 0 serves the store\n"
    "                          (default 127.0.0.1); it listens on A only (0.0.0.0:\n"
    "                          every interface). Unauthenticated: keep the port\n"
    "                          on a network only the job's hosts reach\n"
    "      --master-port P     port of that store (default 29500)\n"
    "      --local-addr ADDR   address this node's ranks bind to\n"
    "      --timeout-ms T      rendezvous and communication timeout of the ranks\n"
    "      --backend B         communication backend plugin (default gloo)\n"
    "      --max-restarts R    when a rank fails, stop this node's ranks and start\n"
    "                          them again, up to R times (default 0); each start is\n"
    "                          a new rendezvous (torchrun's --max-restarts). With\n"
    "                          several nodes they restart together: node 0's\n"
    "                          launcher then serves the store, and the ranks of\n"
    "                          start S meet under tcp://A:P/worker/attempt_S\n"
    "  -h, --help              print this help\n"
    "Options may also be written --name=value, and with '_' for '-'.\n"
    "\n"
    "--backend mpi: the ranks are started by mpirun (-np N --oversubscribe\n"
    "  --bind-to none --tag-output; $SHARDPLAN_MPIRUN overrides the program), with\n"
    "  Open MPI's OMPI_COMM_WORLD_* variables instead of torchrun's and no store;\n"
    "  SHARDPLAN_* variables are exported to the ranks with -x. One node only: for\n"
    "  several, run mpirun with a hostfile.\n"
    "\n"
    "environment of local rank i (N ranks per node, M nodes, node rank K):\n"
    "  RANK=K*N+i WORLD_SIZE=M*N LOCAL_RANK=i LOCAL_WORLD_SIZE=N GROUP_RANK=K\n"
    "  GROUP_WORLD_SIZE=M MASTER_ADDR=A MASTER_PORT=P SHARDPLAN_BACKEND=B\n"
    "  SHARDPLAN_STORE=file://<temporary dir>/store with one node (the directory is\n"
    "    removed when the launcher exits), tcp://A:P with several (with restarts:\n"
    "    tcp://A:P/worker/attempt_S)\n"
    "  SHARDPLAN_LOCAL_ADDR=ADDR, SHARDPLAN_TIMEOUT_MS=T when those options are given\n"
    "  SHARDPLAN_RESTART_COUNT and TORCHELASTIC_RESTART_COUNT: 0, then 1, 2, ... on\n"
    "    each restart\n"
    "  SHARDPLAN_JOB_ID: new per launch; names the job's shared-memory segments,\n"
    "    which the launcher removes when the ranks are gone (and at start, those\n"
    "    of any job whose process is gone: a launcher killed with SIGKILL)\n"
    "  SHARDPLAN_NUM_THREADS, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS: each rank's\n"
    "    CPU threads, $SHARDPLAN_NUM_THREADS or else the cores / N (at least 1); a\n"
    "    variable already set is left as it is (docs/THREADS.md)\n"
    "Standard input of the ranks is /dev/null.\n"
    "\n"
    "exit status: 0 when every rank exits 0; 1 when a rank fails (the others get\n"
    "SIGTERM, then SIGKILL 5 s later) and no restart is left; 2 for a usage error; 128+S when the\n"
    "launcher receives signal S, whenever it comes, restarts included (SIGINT,\n"
    "SIGTERM, SIGHUP are forwarded to the ranks; a second one sends SIGKILL).\n";

namespace {

// ---------------------------------------------------------------- options

long long parse_integer(const std::string& option, const std::string& value, long long lo,
                        long long hi) {
  try {
    return shardplan::count_option(option, value, lo, hi);
  } catch (const shardplan::CountError& e) {
    throw UsageError{e.what()};
  }
}

}  // namespace

Options parse_options(int argc, char** argv) {
  Options o;
  bool have_nproc = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      o.program.assign(argv + i + 1, argv + argc);
      break;
    }
    if (arg == "-h" || arg == "--help") {
      o.help = true;
      return o;
    }
    if (arg.size() < 2 || arg[0] != '-') {  // torchrun style: the program needs no '--'
      o.program.assign(argv + i, argv + argc);
      break;
    }
    std::string name = arg, value;
    bool inline_value = false;
    if (arg.compare(0, 2, "--") == 0) {
      size_t eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inline_value = true;
      }
      // torchrun spells its options with '_' as well.
      std::replace(name.begin() + 2, name.end(), '_', '-');
    } else if (arg.compare(0, 2, "-n") == 0 && arg.size() > 2) {
      name = "-n";
      value = arg.substr(2);
      inline_value = true;
    }
    static const char* const kKnown[] = {"-n",          "--nproc-per-node", "--nnodes",
                                         "--node-rank", "--master-addr",    "--master-port",
                                         "--local-addr", "--timeout-ms",    "--backend", "--max-restarts"};
    if (std::find_if(std::begin(kKnown), std::end(kKnown),
                     [&](const char* k) { return name == k; }) == std::end(kKnown))
      throw UsageError{"unknown option '" + arg + "'"};
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError{"option '" + name + "' needs a value"};
      value = argv[++i];
    }
    if (name == "-n" || name == "--nproc-per-node") {
      o.nproc = static_cast<int>(parse_integer("-n/--nproc-per-node", value, 1, kMaxRanksPerNode));
      have_nproc = true;
    } else if (name == "--nnodes") {
      o.nnodes = static_cast<int>(parse_integer(name, value, 1, 1 << 20));
    } else if (name == "--node-rank") {
      o.node_rank = static_cast<int>(parse_integer(name, value, 0, (1 << 20) - 1));
    } else if (name == "--master-addr") {
      if (value.empty()) throw UsageError{"--master-addr must not be empty"};
      o.master_addr = value;
    } else if (name == "--master-port") {
      o.master_port = static_cast<int>(parse_integer(name, value, 1, 65535));
    } else if (name == "--local-addr") {
      if (value.empty()) throw UsageError{"--local-addr must not be empty"};
      o.has_local_addr = true;
      o.local_addr = value;
    } else if (name == "--timeout-ms") {
      o.has_timeout = true;
      o.timeout_ms = parse_integer(name, value, 1, 1000000000000LL);
    } else if (name == "--max-restarts") {
      o.max_restarts = static_cast<int>(parse_integer(name, value, 0, 1000));
    } else if (name == "--backend") {
      if (value.empty()) throw UsageError{"--backend must not be empty"};
      o.backend = value;
    }
  }
  if (!have_nproc) throw UsageError{"-n/--nproc-per-node is required"};
  if (o.node_rank >= o.nnodes)
    throw UsageError{"--node-rank must be below --nnodes (" + std::to_string(o.nnodes) + "), got " +
                     std::to_string(o.node_rank)};
  if (static_cast<long long>(o.nnodes) * o.nproc > (1LL << 30))
    throw UsageError{"--nnodes times -n is too large"};
  if (o.backend == "local")
    throw UsageError{
        "backend 'local' runs ranks as threads of one process; run the program with --ranks N "
        "instead of the launcher"};
  if (o.backend == "mpi" && o.nnodes > 1)
    throw UsageError{
        "backend 'mpi' starts its ranks with mpirun on this node only; for several nodes use mpirun "
        "with a hostfile (mpirun -np N --hostfile FILE program ...)"};
  if (o.backend == "mpi" && o.has_local_addr)
    throw UsageError{"--local-addr has no effect with backend 'mpi': MPI picks its own transport"};
  if (o.program.empty())
    throw UsageError{"no program given (usage: shardplan launch -n N [options] -- program [args...])"};
  return o;
}

// Mirrors execvp's search so that a misspelt program is one usage error here
// rather than N identical failures of the ranks. Returns "" when runnable.
std::string why_not_executable(const std::string& program) {
  auto check = [](const std::string& path) -> int {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (access(path.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (program.find('/') != std::string::npos) {
    int err = check(program);
    return err ? strerror(err) : "";
  }
  const char* path_env = getenv("PATH");
  std::string path = path_env ? path_env : "/bin:/usr/bin";
  int first_error = 0;
  size_t start = 0;
  while (true) {
    size_t end = path.find(':', start);
    std::string dir = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    int err = check((dir.empty() ? std::string(".") : dir) + "/" + program);
    if (err == 0) return "";
    if (err != ENOENT && err != ENOTDIR && first_error == 0) first_error = err;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return first_error ? strerror(first_error) : "not found in PATH";
}

}  // namespace launcher
}  // namespace shardplan_cli
