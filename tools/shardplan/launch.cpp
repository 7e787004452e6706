// `shardplan launch`: runs the ranks of one node as child processes with the
// environment torchrun gives them, prefixes their output with the rank, and
// stops the whole node as soon as one rank fails.
//
// With --backend mpi the ranks must be MPI's, so mpirun starts them: the
// launcher runs mpirun as its single child and keeps its own part (signal
// forwarding, SIGKILL escalation, no leftovers, exit status), while mpirun's
// per-line rank tags are rewritten into the launcher's "[rank K] " prefix so
// output reads the same with every backend. mpirun ends the job when a rank
// fails, which is the fail-fast the other backends get from the launcher.
//
// Plain C++17 + POSIX on purpose: the launcher must start instantly and must
// not touch CUDA or libtorch, since it is the parent of every rank.
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <algorithm>
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "thread_env.h"

extern char** environ;

namespace shardplan_cli {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
constexpr int kMaxRanksPerNode = 1024;  // two pipes each; keeps us well inside fd limits
// Between the polite signal and SIGKILL: room for a rank to flush its logs.
constexpr milliseconds kGrace{5000};
// A rank that survives SIGKILL this long is stuck in the kernel; waiting
// longer would only make the launcher hang too.
constexpr milliseconds kKillWait{10000};
// How long output is still read once every rank is gone: only a stray
// descendant in another process group can keep a pipe open that long.
constexpr milliseconds kDrainLimit{1000};
constexpr size_t kReadChunk = 64 * 1024;
// A "line" this long without a newline is printed anyway, so a child that
// never ends its line cannot grow our memory without bound.
constexpr size_t kMaxPendingLine = 1 << 20;

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
    "                          (default 127.0.0.1)\n"
    "      --master-port P     port of that store (default 29500)\n"
    "      --local-addr ADDR   address this node's ranks bind to\n"
    "      --timeout-ms T      rendezvous and communication timeout of the ranks\n"
    "      --backend B         communication backend plugin (default gloo)\n"
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
    "    removed when the launcher exits), tcp://A:P with several\n"
    "  SHARDPLAN_LOCAL_ADDR=ADDR, SHARDPLAN_TIMEOUT_MS=T when those options are given\n"
    "  SHARDPLAN_NUM_THREADS, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS: each rank's\n"
    "    CPU threads, $SHARDPLAN_NUM_THREADS or else the cores / N (at least 1); a\n"
    "    variable already set is left as it is (docs/THREADS.md)\n"
    "Standard input of the ranks is /dev/null.\n"
    "\n"
    "exit status: 0 when every rank exits 0; 1 when a rank fails (the others get\n"
    "SIGTERM, then SIGKILL 5 s later); 2 for a usage error; 128+S when the\n"
    "launcher receives signal S (SIGINT, SIGTERM, SIGHUP are forwarded to the\n"
    "ranks; a second one sends SIGKILL).\n";

struct UsageError {
  std::string message;
};

// ---------------------------------------------------------------- options

struct Options {
  int nproc = 0;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool has_local_addr = false;
  std::string local_addr;
  bool has_timeout = false;
  long long timeout_ms = 0;
  std::string backend = "gloo";
  std::vector<std::string> program;
  bool help = false;
};

long long parse_integer(const std::string& option, const std::string& value, long long lo,
                        long long hi) {
  bool ok = !value.empty() && value.size() <= 15 &&
            std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; });
  long long v = ok ? std::stoll(value) : 0;
  if (!ok || v < lo || v > hi)
    throw UsageError{option + " must be an integer from " + std::to_string(lo) + " to " +
                     std::to_string(hi) + ", got '" + value + "'"};
  return v;
}

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
                                         "--local-addr", "--timeout-ms",    "--backend"};
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

// ---------------------------------------------------------------- output

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {  // someone gave us a non-blocking stdout
        pollfd p{fd, POLLOUT, 0};
        poll(&p, 1, 100);
        continue;
      }
      return;  // e.g. EPIPE after `| head`: drop the output, keep supervising the ranks
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void write_all(int fd, const std::string& s) { write_all(fd, s.data(), s.size()); }

void say(const std::string& line) { write_all(STDERR_FILENO, "shardplan launch: " + line + "\n"); }

std::string signal_name(int signo) {
  static const struct {
    int signo;
    const char* name;
  } kNames[] = {{SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
                {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
                {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"}, {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
                {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
                {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"}, {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
                {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},   {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
                {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGSYS, "SIGSYS"}};
  for (const auto& n : kNames)
    if (n.signo == signo) return n.name;
  return "";
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    std::string name = signal_name(s);
    return "was killed by signal " + std::to_string(s) + (name.empty() ? "" : " (" + name + ")");
  }
  return "ended with wait status " + std::to_string(status);
}

// ---------------------------------------------------------------- signals

int g_signal_pipe_write = -1;

// Only forwards the signal number to the main loop: everything else is done
// there, outside signal context.
extern "C" void forward_to_loop(int signo) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(signo);
  ssize_t ignored = write(g_signal_pipe_write, &b, 1);
  (void)ignored;
  errno = saved;
}

struct SavedAction {
  int signo;
  struct sigaction action;
};

bool set_cloexec_nonblock(int fd, bool nonblock) {
  int fdflags = fcntl(fd, F_GETFD);
  if (fdflags < 0 || fcntl(fd, F_SETFD, fdflags | FD_CLOEXEC) < 0) return false;
  if (nonblock) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return false;
  }
  return true;
}

// Close-on-exec everywhere, so a rank never inherits another rank's write end
// (which would keep that rank's pipe open after it exits).
bool make_pipe(int fds[2], bool nonblock_read) {
  if (pipe(fds) != 0) return false;
  if (set_cloexec_nonblock(fds[0], nonblock_read) && set_cloexec_nonblock(fds[1], false)) return true;
  close(fds[0]);
  close(fds[1]);
  return false;
}

// ---------------------------------------------------------------- temp dir

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;
}

// The single-node store lives in a directory only this job uses, so a stale
// store file of an earlier job can never be picked up.
class TempDir {
 public:
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    if (!path_.empty()) nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  }
  bool create() {
    const char* tmp = getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/shardplan-launch-XXXXXX";
    std::vector<char> buf(templ.begin(), templ.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data())) return false;
    // Absolute and symlink-free, since it ends up in a URL every rank opens.
    char* real = realpath(buf.data(), nullptr);
    path_ = real ? real : buf.data();
    free(real);
    return true;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- launcher

struct Stream {
  int fd = -1;
  int target = -1;  // our stdout or stderr
  std::string pending;  // an incomplete last line

  // mpirun --tag-output streams: what is not parsed yet, the rank the text
  // being read belongs to (-1: mpirun's own), and each rank's incomplete line.
  bool tagged = false;
  std::string raw;
  int current = -1;
  bool line_start = true;
  std::map<int, std::string> lines;
};

struct Rank {
  int global = 0;
  std::string label;  // "rank K", or "mpirun"
  std::string prefix;
  pid_t pid = -1;  // also the id of its process group
  bool running = false;
  int wait_status = 0;
  Stream out, err;
};

class Launcher {
 public:
  explicit Launcher(Options o) : opt_(std::move(o)) {}
  ~Launcher();
  int run();

 private:
  std::vector<std::string> environment_for(int local_rank) const;
  std::vector<std::string> environment_for_mpirun() const;
  std::vector<std::string> mpirun_command(const std::vector<std::string>& env) const;
  bool setup();
  bool spawn(Rank& r, const std::vector<std::string>& argv, const std::vector<std::string>& env);
  void pump(int timeout_ms);
  bool read_once(Rank& r, Stream& s);
  void emit(Rank& r, Stream& s, const char* data, size_t size);
  void emit_tagged(Stream& s, const char* data, size_t size);
  void flush_tagged(Stream& s);
  void close_stream(Rank& r, Stream& s);
  void drain(Rank& r);
  void reap();
  void on_rank_exit(Rank& r);
  void on_signal(int signo);
  void stop_ranks(int signo);
  void kill_running(int signo);
  void signal_rank(const Rank& r, int signo);
  bool leftovers_alive() const;
  void signal_leftovers(int signo);
  int running_count() const;
  std::string children() const;
  bool any_stream_open() const;

  Options opt_;
  TempDir store_dir_;
  std::string store_url_;
  std::vector<Rank> ranks_;
  std::vector<SavedAction> saved_actions_;
  int signal_pipe_[2] = {-1, -1};
  int devnull_ = -1;

  bool failed_ = false;       // a rank failed, or a rank could not be started
  int interrupted_by_ = 0;    // the signal the launcher received first
  bool stopping_ = false;     // ranks have been asked to stop
  int stop_signal_ = SIGTERM;
  Clock::time_point kill_at_;
  bool killed_ = false;       // SIGKILL sent
  Clock::time_point killed_at_;
  bool hurry_ = false;        // a signal arrived once no rank was left
};

Launcher::~Launcher() {
  for (const SavedAction& s : saved_actions_) sigaction(s.signo, &s.action, nullptr);
  for (int fd : {signal_pipe_[0], signal_pipe_[1], devnull_})
    if (fd >= 0) close(fd);
  g_signal_pipe_write = -1;
}

std::vector<std::string> Launcher::environment_for(int local_rank) const {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(opt_.node_rank * opt_.nproc + local_rank)},
      {"WORLD_SIZE", std::to_string(opt_.nnodes * opt_.nproc)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(opt_.nproc)},
      {"GROUP_RANK", std::to_string(opt_.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(opt_.nnodes)},
      {"MASTER_ADDR", opt_.master_addr},
      {"MASTER_PORT", std::to_string(opt_.master_port)},
      {"SHARDPLAN_BACKEND", opt_.backend},
      {"SHARDPLAN_STORE", store_url_},
  };
  // Without the option, a value the user exported is passed through untouched.
  if (opt_.has_local_addr) ours.emplace_back("SHARDPLAN_LOCAL_ADDR", opt_.local_addr);
  if (opt_.has_timeout) ours.emplace_back("SHARDPLAN_TIMEOUT_MS", std::to_string(opt_.timeout_ms));
  // Several ranks per node each running full-width libtorch and BLAS pools
  // oversubscribe the cores many times over. A value the user set wins.
  for (auto& kv : thread_environment(opt_.nproc)) ours.push_back(std::move(kv));

  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (std::none_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; }))
      env.emplace_back(*e);
  }
  for (const auto& kv : ours) env.push_back(kv.first + "=" + kv.second);
  return env;
}

// mpirun's own environment, which its local ranks inherit. torchrun's
// variables go: WorldOptions::from_env prefers them to Open MPI's, and an
// inherited SHARDPLAN_STORE would point the ranks at a stale rendezvous.
std::vector<std::string> Launcher::environment_for_mpirun() const {
  static const char* const kDropped[] = {"RANK",        "WORLD_SIZE",       "LOCAL_RANK",  "LOCAL_WORLD_SIZE",
                                         "GROUP_RANK",  "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                         "SHARDPLAN_STORE"};
  std::vector<std::pair<std::string, std::string>> ours = {{"SHARDPLAN_BACKEND", opt_.backend}};
  if (opt_.has_timeout) ours.emplace_back("SHARDPLAN_TIMEOUT_MS", std::to_string(opt_.timeout_ms));
  for (auto& kv : thread_environment(opt_.nproc)) ours.push_back(std::move(kv));
  // Open MPI refuses root unless told twice; as root the user has already
  // chosen to run the job so, and the launcher's other backends do not ask.
  if (geteuid() == 0) {
    if (!getenv("OMPI_ALLOW_RUN_AS_ROOT")) ours.emplace_back("OMPI_ALLOW_RUN_AS_ROOT", "1");
    if (!getenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")) ours.emplace_back("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    std::string name = eq ? std::string(*e, static_cast<size_t>(eq - *e)) : std::string(*e);
    if (std::any_of(std::begin(kDropped), std::end(kDropped), [&](const char* d) { return name == d; })) continue;
    if (std::none_of(ours.begin(), ours.end(), [&](const auto& kv) { return kv.first == name; }))
      env.emplace_back(*e);
  }
  for (const auto& kv : ours) env.push_back(kv.first + "=" + kv.second);
  return env;
}

std::vector<std::string> Launcher::mpirun_command(const std::vector<std::string>& env) const {
  const char* custom = getenv("SHARDPLAN_MPIRUN");
  std::vector<std::string> argv = {custom && *custom ? custom : "mpirun", "-np", std::to_string(opt_.nproc),
                                   // The launcher never limits ranks to cores,
                                   // nor pins them; neither should mpirun.
                                   "--oversubscribe", "--bind-to", "none", "--tag-output"};
  // Local ranks inherit mpirun's environment anyway; -x also carries these
  // to a remote node once mpirun is given one.
  for (const std::string& e : env) {
    const std::string name = e.substr(0, e.find('='));
    if (name.compare(0, 10, "SHARDPLAN_") == 0 || name == "OMP_NUM_THREADS" || name == "OPENBLAS_NUM_THREADS") {
      argv.push_back("-x");
      argv.push_back(name);
    }
  }
  argv.push_back("--");
  argv.insert(argv.end(), opt_.program.begin(), opt_.program.end());
  return argv;
}

bool Launcher::setup() {
  if (!make_pipe(signal_pipe_, true) || !set_cloexec_nonblock(signal_pipe_[1], true)) {
    say(std::string("cannot create a pipe: ") + strerror(errno));
    return false;
  }
  g_signal_pipe_write = signal_pipe_[1];
  devnull_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull_ < 0) {
    say(std::string("cannot open /dev/null: ") + strerror(errno));
    return false;
  }
#ifdef __linux__
  // Orphaned descendants of a rank are re-parented to us rather than to init,
  // so we reap them (init in a container may not) and see them in waitpid.
  prctl(PR_SET_CHILD_SUBREAPER, 1);
#endif
  for (int signo : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    SavedAction saved{signo, {}};
    if (sigaction(signo, nullptr, &saved.action) != 0) continue;
    saved_actions_.push_back(saved);
    // Like a shell: an ignored SIGINT (background job) or SIGHUP (nohup)
    // stays ignored, for us and for the ranks.
    if ((signo == SIGINT || signo == SIGHUP) && saved.action.sa_handler == SIG_IGN) continue;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    // A closed stdout must not kill the launcher while the ranks still run.
    sa.sa_handler = signo == SIGPIPE ? SIG_IGN : forward_to_loop;
    sa.sa_flags = SA_RESTART | (signo == SIGCHLD ? SA_NOCLDSTOP : 0);
    sigaction(signo, &sa, nullptr);
  }
  return true;
}

bool Launcher::spawn(Rank& r, const std::vector<std::string>& args, const std::vector<std::string>& env) {
  int out[2], err[2];
  if (!make_pipe(out, true)) {
    say(std::string("cannot create a pipe: ") + strerror(errno));
    return false;
  }
  if (!make_pipe(err, true)) {
    say(std::string("cannot create a pipe: ") + strerror(errno));
    close(out[0]);
    close(out[1]);
    return false;
  }
  // Built before fork: the child should only call async-signal-safe functions.
  std::vector<char*> argv, envp;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const std::string exec_error_prefix = "shardplan launch: cannot execute '" + args[0] + "': ";

  // Blocked across fork so no handler of ours runs in the child before it has
  // restored the original dispositions.
  sigset_t block, previous;
  sigemptyset(&block);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&block, s);
  sigprocmask(SIG_BLOCK, &block, &previous);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // Own process group: a terminal's Ctrl-C reaches only the launcher (which
    // forwards it), and one kill() reaches the rank's own children too.
    setpgid(0, 0);
#ifdef __linux__
    // If the launcher dies without cleaning up (SIGKILL), so does the rank.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(kExitFailure);
#else
    (void)parent;
#endif
    for (const SavedAction& s : saved_actions_) sigaction(s.signo, &s.action, nullptr);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (dup2(devnull_, STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 ||
        dup2(err[1], STDERR_FILENO) < 0)
      _exit(127);
    environ = envp.data();
    execvp(argv[0], argv.data());
    const char* reason = strerror(errno);
    int code = errno == ENOENT ? 127 : 126;  // the shell's convention
    ssize_t ignored = write(STDERR_FILENO, exec_error_prefix.data(), exec_error_prefix.size());
    ignored = write(STDERR_FILENO, reason, strlen(reason));
    ignored = write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    _exit(code);
  }
  const int fork_errno = errno;
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    say("cannot start " + r.label + ": " + strerror(fork_errno));
    return false;
  }
  setpgid(pid, pid);  // also here, so kill(-pid) works whichever of us runs first
  r.pid = pid;
  r.running = true;
  r.out.fd = out[0];
  r.err.fd = err[0];
  return true;
}

// ------------------------------------------------------- mpirun's tags

enum class TagMatch { kNo, kPartial, kFull };

// Whether `s` at `pos` starts with mpirun's tag "[JOB,RANK]<stdout>:" (or
// <stderr>:, <stddiag>:); kPartial when `s` ends inside what could still
// become one.
TagMatch match_tag(const std::string& s, size_t pos, int* rank, size_t* length) {
  size_t i = pos;
  if (i >= s.size()) return TagMatch::kPartial;
  if (s[i++] != '[') return TagMatch::kNo;
  long long numbers[2] = {0, 0};
  const char stops[2] = {',', ']'};
  for (int k = 0; k < 2; ++k) {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (i - start >= 9) return TagMatch::kNo;
      numbers[k] = numbers[k] * 10 + (s[i++] - '0');
    }
    if (i >= s.size()) return TagMatch::kPartial;
    if (i == start || s[i++] != stops[k]) return TagMatch::kNo;
  }
  for (const char* word : {"<stdout>:", "<stderr>:", "<stddiag>:"}) {
    const size_t len = strlen(word), have = std::min(len, s.size() - i);
    if (s.compare(i, have, word, have) != 0) continue;
    if (have < len) return TagMatch::kPartial;
    *rank = static_cast<int>(numbers[1]);
    *length = i + len - pos;
    return TagMatch::kFull;
  }
  return TagMatch::kNo;
}

std::string rank_prefix(int rank) { return rank < 0 ? std::string() : "[rank " + std::to_string(rank) + "] "; }

// mpirun tags every line of a rank's output, and also each piece of one that
// it forwards before the line is complete (the piece ends without a newline,
// and whatever comes next, of any rank, starts with a tag). Pieces are
// collected per rank into whole lines, printed with the launcher's prefix;
// mpirun's own untagged messages pass through as they are.
void Launcher::emit_tagged(Stream& s, const char* data, size_t size) {
  s.raw.append(data, size);
  std::string out;
  size_t pos = 0;
  while (pos < s.raw.size()) {
    if (s.line_start) {
      int rank = -1;
      size_t len = 0;
      const TagMatch m = match_tag(s.raw, pos, &rank, &len);
      if (m == TagMatch::kPartial) break;
      s.line_start = false;
      if (m == TagMatch::kFull) {
        s.current = rank;
        pos += len;
        continue;
      }
      s.current = -1;
    }
    const size_t nl = s.raw.find('\n', pos);
    // A tag before the end of this line starts another rank's piece.
    size_t tag = std::string::npos;
    TagMatch tag_kind = TagMatch::kNo;
    for (size_t b = s.raw.find('[', pos); b != std::string::npos && b < nl; b = s.raw.find('[', b + 1)) {
      int rank;
      size_t len;
      tag_kind = match_tag(s.raw, b, &rank, &len);
      if (tag_kind != TagMatch::kNo) {
        tag = b;
        break;
      }
    }
    std::string& line = s.lines[s.current];
    if (tag != std::string::npos) {
      line.append(s.raw, pos, tag - pos);
      pos = tag;
      s.line_start = true;
      if (tag_kind == TagMatch::kPartial) break;
    } else if (nl != std::string::npos) {
      line.append(s.raw, pos, nl + 1 - pos);
      out += rank_prefix(s.current) + line;
      line.clear();
      pos = nl + 1;
      s.line_start = true;
    } else {
      line.append(s.raw, pos, std::string::npos);
      pos = s.raw.size();
    }
    if (line.size() >= kMaxPendingLine) {
      out += rank_prefix(s.current) + line + "\n";
      line.clear();
    }
  }
  s.raw.erase(0, pos);
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::flush_tagged(Stream& s) {
  if (!s.raw.empty()) {
    s.lines[s.line_start ? -1 : s.current] += s.raw;
    s.raw.clear();
  }
  std::string out;
  for (auto& kv : s.lines)
    if (!kv.second.empty()) out += rank_prefix(kv.first) + kv.second + "\n";
  s.lines.clear();
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::emit(Rank& r, Stream& s, const char* data, size_t size) {
  if (s.tagged) return emit_tagged(s, data, size);
  const size_t scanned = s.pending.size();
  s.pending.append(data, size);
  std::string out;
  size_t start = 0;
  for (size_t nl = s.pending.find('\n', scanned); nl != std::string::npos;
       nl = s.pending.find('\n', start)) {
    out += r.prefix;
    out.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= kMaxPendingLine) {
    out += r.prefix + s.pending + "\n";
    s.pending.clear();
  }
  // One write per chunk: lines of different ranks interleave only whole.
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::close_stream(Rank& r, Stream& s) {
  if (s.tagged) flush_tagged(s);
  if (!s.pending.empty()) {
    write_all(s.target, r.prefix + s.pending + "\n");
    s.pending.clear();
  }
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

// Returns true when it read something.
bool Launcher::read_once(Rank& r, Stream& s) {
  static char buf[kReadChunk];
  ssize_t n = read(s.fd, buf, sizeof buf);
  if (n > 0) {
    emit(r, s, buf, static_cast<size_t>(n));
    return true;
  }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) close_stream(r, s);
  return false;
}

// Reads what an exited rank left in its pipes, so its last words are printed
// before the launcher's verdict on it. Bounded: a descendant still holding the
// pipe could otherwise keep us here.
void Launcher::drain(Rank& r) {
  for (Stream* s : {&r.out, &r.err})
    for (int i = 0; i < 32 && s->fd >= 0; ++i)
      if (!read_once(r, *s)) break;
}

void Launcher::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  fds.push_back({signal_pipe_[0], POLLIN, 0});
  owners.emplace_back(nullptr, nullptr);
  for (Rank& r : ranks_)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
  int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready > 0) {
    // One chunk per stream per round, so a chatty rank cannot starve the others.
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) read_once(*owners[i].first, *owners[i].second);
    if (fds[0].revents & POLLIN) {
      unsigned char signals[64];
      ssize_t n;
      while ((n = read(signal_pipe_[0], signals, sizeof signals)) > 0)
        for (ssize_t i = 0; i < n; ++i)
          if (signals[i] != SIGCHLD) on_signal(signals[i]);
    }
  }
  // Every round, not only on SIGCHLD: cheap, and immune to a lost wake-up.
  reap();
}

void Launcher::reap() {
  while (true) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;
    auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == pid; });
    if (it == ranks_.end() || !it->running) continue;  // an orphaned descendant handed to us
    it->running = false;
    it->wait_status = status;
    drain(*it);
    on_rank_exit(*it);
  }
}

void Launcher::on_rank_exit(Rank& r) {
  const bool ok = WIFEXITED(r.wait_status) && WEXITSTATUS(r.wait_status) == 0;
  // Once we are stopping the ranks, their deaths are our doing: one verdict only.
  if (ok || stopping_) return;
  failed_ = true;
  const int others = running_count();
  std::string msg = r.label + " (pid " + std::to_string(r.pid) + ") " +
                    describe_wait_status(r.wait_status);
  if (others > 0) msg += "; terminating " + std::to_string(others) + " other rank(s)";
  say(msg);
  stop_ranks(SIGTERM);
}

void Launcher::on_signal(int signo) {
  const std::string name = signal_name(signo);
  if (running_count() == 0) {
    hurry_ = true;
    return;
  }
  if (!stopping_) {
    interrupted_by_ = signo;
    say("received " + name + "; forwarding it to " + children());
    stop_ranks(signo);
  } else if (!killed_) {
    say("received " + name + " again; sending SIGKILL to " + children());
    kill_running(SIGKILL);
  }
}

void Launcher::stop_ranks(int signo) {
  stopping_ = true;
  stop_signal_ = signo;
  kill_at_ = Clock::now() + kGrace;
  for (const Rank& r : ranks_)
    if (r.running) signal_rank(r, signo);
}

void Launcher::kill_running(int signo) {
  killed_ = true;
  killed_at_ = Clock::now();
  for (const Rank& r : ranks_)
    if (r.running) signal_rank(r, signo);
}

void Launcher::signal_rank(const Rank& r, int signo) {
  kill(-r.pid, signo);
  // A rank that moved itself to another process group is signalled directly.
  if (getpgid(r.pid) != r.pid) kill(r.pid, signo);
}

// Descendants of the ranks still in the ranks' process groups.
bool Launcher::leftovers_alive() const {
  for (const Rank& r : ranks_)
    if (r.pid > 0 && kill(-r.pid, 0) == 0) return true;
  return false;
}

void Launcher::signal_leftovers(int signo) {
  for (const Rank& r : ranks_)
    if (r.pid > 0 && kill(-r.pid, 0) == 0) kill(-r.pid, signo);
}

int Launcher::running_count() const {
  return static_cast<int>(std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.running; }));
}

// Who the running children are, for messages: "3 rank(s)", or "mpirun".
std::string Launcher::children() const {
  if (ranks_.size() == 1 && ranks_[0].label == "mpirun") return "mpirun";
  return std::to_string(running_count()) + " rank(s)";
}

bool Launcher::any_stream_open() const {
  return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out.fd >= 0 || r.err.fd >= 0; });
}

int ms_until(Clock::time_point t) {
  auto left = std::chrono::duration_cast<milliseconds>(t - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left + 1, 1 << 30));
}

int Launcher::run() {
  const bool mpi = opt_.backend == "mpi";
  if (mpi) {
    // MPI needs no store: mpirun tells each rank who it is.
  } else if (opt_.nnodes == 1) {
    if (!store_dir_.create()) {
      say(std::string("cannot create a temporary directory: ") + strerror(errno));
      return kExitFailure;
    }
    store_url_ = "file://" + store_dir_.path() + "/store";
  } else {
    const bool ipv6 = opt_.master_addr.find(':') != std::string::npos && opt_.master_addr[0] != '[';
    store_url_ = "tcp://" + (ipv6 ? "[" + opt_.master_addr + "]" : opt_.master_addr) + ":" +
                 std::to_string(opt_.master_port);
  }
  if (!setup()) return kExitFailure;

  ranks_.resize(mpi ? 1 : static_cast<size_t>(opt_.nproc));
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& r = ranks_[i];
    r.global = opt_.node_rank * opt_.nproc + static_cast<int>(i);
    r.label = mpi ? "mpirun" : "rank " + std::to_string(r.global);
    r.prefix = mpi ? "" : "[rank " + std::to_string(r.global) + "] ";
    r.out.target = STDOUT_FILENO;
    r.err.target = STDERR_FILENO;
    r.out.tagged = r.err.tagged = mpi;
  }
  for (Rank& r : ranks_) {
    bool started;
    if (mpi) {
      const std::vector<std::string> env = environment_for_mpirun();
      started = spawn(r, mpirun_command(env), env);
    } else {
      started = spawn(r, opt_.program, environment_for(static_cast<int>(&r - ranks_.data())));
    }
    if (!started) {
      failed_ = true;
      stop_ranks(SIGTERM);
      break;
    }
  }

  while (running_count() > 0) {
    int timeout = -1;
    if (stopping_ && !killed_) timeout = ms_until(kill_at_);
    if (killed_) timeout = ms_until(killed_at_ + kKillWait);
    pump(timeout);
    if (stopping_ && !killed_ && Clock::now() >= kill_at_ && running_count() > 0) {
      say(children() + " still running " +
          std::to_string(kGrace.count() / 1000) + " s after " + signal_name(stop_signal_) +
          "; sending SIGKILL");
      kill_running(SIGKILL);
    }
    if (killed_ && Clock::now() >= killed_at_ + kKillWait && running_count() > 0) {
      say(children() + " survived SIGKILL; giving up on them");
      failed_ = true;
      break;
    }
  }

  // No orphans: whatever the ranks started in their process groups goes too.
  if (leftovers_alive()) {
    signal_leftovers(SIGTERM);
    const auto deadline = Clock::now() + kGrace;
    while (leftovers_alive() && !hurry_ && Clock::now() < deadline) pump(std::min(50, ms_until(deadline)));
    if (leftovers_alive()) {
      signal_leftovers(SIGKILL);
      const auto reaped_by = Clock::now() + milliseconds(1000);
      while (leftovers_alive() && Clock::now() < reaped_by) pump(std::min(20, ms_until(reaped_by)));
    }
  }
  const auto drain_deadline = Clock::now() + kDrainLimit;
  while (any_stream_open() && Clock::now() < drain_deadline) pump(ms_until(drain_deadline));
  for (Rank& r : ranks_) {
    close_stream(r, r.out);
    close_stream(r, r.err);
  }

  if (interrupted_by_) return 128 + interrupted_by_;
  return failed_ ? kExitFailure : 0;
}

}  // namespace

int launch_main(int argc, char** argv) {
  Options options;
  try {
    options = parse_options(argc, argv);
  } catch (const UsageError& e) {
    say(e.message);
    return kExitUsage;
  }
  if (options.help) {
    write_all(STDOUT_FILENO, kUsage);
    return 0;
  }
  const std::string why = why_not_executable(options.program[0]);
  if (!why.empty()) {
    say("cannot execute '" + options.program[0] + "': " + why);
    return kExitUsage;
  }
  if (options.backend == "mpi") {
    const char* custom = getenv("SHARDPLAN_MPIRUN");
    const std::string mpirun = custom && *custom ? custom : "mpirun";
    const std::string why_mpirun = why_not_executable(mpirun);
    if (!why_mpirun.empty()) {
      say("backend 'mpi' starts its ranks with mpirun, but '" + mpirun + "' cannot be executed: " + why_mpirun +
          " (install Open MPI or set SHARDPLAN_MPIRUN)");
      return kExitUsage;
    }
  }
  Launcher launcher(std::move(options));
  return launcher.run();
}

}  // namespace shardplan_cli
