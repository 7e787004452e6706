#pragma once
// What the files of `shardplan launch` share (launch.cpp: the launcher's
// run loop; launch_options.cpp: the command line; launch_env.cpp: the ranks'
// environment and mpirun's command; launch_output.cpp: the ranks' output,
// prefixed, and mpirun's tags; launch_posix.cpp: pipes, signals, waits and
// the temporary store directory; launch_shm_cleanup.cpp: the job's id and
// its shared-memory segments). Internal to the tool.
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

namespace shardplan_cli {
namespace launcher {

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

extern const char* const kUsage;

struct UsageError {
  std::string message;
};

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
  int max_restarts = 0;
  int restart = 0;  // which start this is: 0, then 1 to max_restarts (not an option)
  std::vector<std::string> program;
  bool help = false;
};

// Throws UsageError.
Options parse_options(int argc, char** argv);
// Mirrors execvp's search; "" when `program` can be run, else why not.
std::string why_not_executable(const std::string& program);

// ---------------------------------------------------------------- posix

void write_all(int fd, const char* data, size_t size);
void write_all(int fd, const std::string& s);
void say(const std::string& line);  // "shardplan launch: <line>" on stderr
// In a job of several nodes, what say() prints after "shardplan launch: ", so
// that a node's failure names the node (the other nodes' logs are elsewhere).
void say_as_node(const std::string& node);
std::string signal_name(int signo);
std::string describe_wait_status(int status);

extern volatile sig_atomic_t g_signal_pipe_write;
// Writes the signal number to the event loop's pipe (when a Launcher runs)
// and remembers the first SIGINT, SIGTERM or SIGHUP for pending_signal().
extern "C" void forward_to_loop(int signo);
struct SavedAction {
  int signo;
  struct sigaction action;
};

// The launcher's signal handlers for the whole job: every start, the stop
// after a failure, the cleanup and the gaps between starts. A signal that
// lands where no event loop reads it is still remembered, so that no moment
// of a restart can swallow it (the job then ends with 128 + its number).
class JobSignals {
 public:
  JobSignals();
  ~JobSignals();
  JobSignals(const JobSignals&) = delete;
  JobSignals& operator=(const JobSignals&) = delete;
  // The dispositions found at start, which the ranks get back.
  const std::vector<SavedAction>& saved() const { return saved_; }

 private:
  std::vector<SavedAction> saved_;
};
// The first SIGINT, SIGTERM or SIGHUP the launcher received, or 0.
int pending_signal();
bool set_cloexec_nonblock(int fd, bool nonblock);
bool make_pipe(int fds[2], bool nonblock_read);

// The single-node store lives in a directory only this job uses, so a stale
// store file of an earlier job can never be picked up.
class TempDir {
 public:
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();
  bool create();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------- shm

// SHARDPLAN_JOB_ID of this launcher's ranks, made once per process.
const std::string& job_id();
// Removes /dev/shm/shardplan-gloo-<job>-*; says how many when any.
int remove_job_segments(const std::string& job);
// Removes every shardplan-gloo-* name whose creating process is gone (any
// job's: a launcher killed with SIGKILL left them); says how many when any.
int remove_stale_segments();

// ---------------------------------------------------------------- launcher

class Rounds;  // launch_rounds.h
// What the event loop's pipe carries besides signal numbers: another node's
// failure of this round, or the job abandoned (Rounds::watch).
constexpr unsigned char kPeerNews = 0;

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
  // `rounds`: the job's coordination between nodes, or null (one node, or
  // no restarts): then a failure here is this node's business only.
  Launcher(Options o, const JobSignals& signals, Rounds* rounds = nullptr)
      : opt_(std::move(o)), signals_(signals), rounds_(rounds) {}
  ~Launcher();
  int run();
  // Why the ranks failed (the launcher's verdict line), "" when none did.
  const std::string& failure() const { return failure_; }
  // Another node ended the job, or the store was lost: no restart can help.
  bool fatal() const { return fatal_; }

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
  void on_peer_news();
  void stop_ranks(int signo);
  void kill_running(int signo);
  void signal_rank(const Rank& r, int signo);
  bool leftovers_alive() const;
  void signal_leftovers(int signo);
  int running_count() const;
  std::string children() const;
  bool any_stream_open() const;

  Options opt_;
  const JobSignals& signals_;
  Rounds* rounds_;
  bool fatal_ = false;
  TempDir store_dir_;
  std::string store_url_;
  std::vector<Rank> ranks_;
  int signal_pipe_[2] = {-1, -1};
  int devnull_ = -1;

  bool failed_ = false;       // a rank failed, or a rank could not be started
  std::string failure_;
  int interrupted_by_ = 0;    // the signal the launcher received first: the job ends
  bool stopping_ = false;     // ranks have been asked to stop
  int stop_signal_ = SIGTERM;
  Clock::time_point kill_at_;
  bool killed_ = false;       // SIGKILL sent
  Clock::time_point killed_at_;
  bool hurry_ = false;        // a signal arrived once no rank was left
};

}  // namespace launcher
}  // namespace shardplan_cli
