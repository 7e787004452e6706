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
#include "commands.h"
#include "launch_internal.h"
#include "launch_rounds.h"
#include <sys/uio.h>

namespace shardplan_cli {
namespace launcher {

Launcher::~Launcher() {
  // First, so that no handler writes to a closed (or reused) descriptor.
  g_signal_pipe_write = -1;
  for (int fd : {signal_pipe_[0], signal_pipe_[1], devnull_})
    if (fd >= 0) close(fd);
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
    for (const SavedAction& s : signals_.saved()) sigaction(s.signo, &s.action, nullptr);
    sigprocmask(SIG_SETMASK, &previous, nullptr);
    if (dup2(devnull_, STDIN_FILENO) < 0 || dup2(out[1], STDOUT_FILENO) < 0 ||
        dup2(err[1], STDERR_FILENO) < 0)
      _exit(127);
    environ = envp.data();
    execvp(argv[0], argv.data());
    const char* reason = strerror(errno);
    int code = errno == ENOENT ? 127 : 126;  // the shell's convention
    // One writev: a pipe write up to PIPE_BUF is atomic, so a rank stopped by
    // the launcher right after the exec error leaves the whole line or none.
    struct iovec parts[3] = {{const_cast<char*>(exec_error_prefix.data()), exec_error_prefix.size()},
                             {const_cast<char*>(reason), strlen(reason)},
                             {const_cast<char*>("\n"), 1}};
    ssize_t ignored = writev(STDERR_FILENO, parts, 3);
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
  failure_ = msg;
  if (others > 0) msg += "; terminating " + std::to_string(others) + " other rank(s)";
  say(msg);
  stop_ranks(SIGTERM);
  if (rounds_) rounds_->report_failure(opt_.restart, failure_);
}

// Another node's ranks failed this round (the whole job restarts), or the
// job was ended elsewhere: this node's ranks stop as after a failure here.
void Launcher::on_peer_news() {
  if (!rounds_ || stopping_ || running_count() == 0) return;
  failed_ = true;
  failure_ = rounds_->news(&fatal_);
  say(failure_ + "; stopping " + children());
  stop_ranks(SIGTERM);
}

// Whenever it comes, the first signal ends the job: no restart follows, and
// the launcher exits with 128 + its number once the ranks are gone.
void Launcher::on_signal(int signo) {
  const std::string name = signal_name(signo);
  const bool first = interrupted_by_ == 0;
  if (first) interrupted_by_ = signo;
  if (running_count() == 0) {
    if (first && !hurry_) say("received " + name + " after the ranks ended; the job ends here");
    hurry_ = true;
    return;
  }
  if (!stopping_) {
    say("received " + name + "; forwarding it to " + children());
    stop_ranks(signo);
  } else if (first) {
    // We are stopping the ranks after a failure; they keep their grace.
    say("received " + name + " while stopping " + children() + " after a failure; forwarding it, and the job ends");
    for (const Rank& r : ranks_)
      if (r.running) signal_rank(r, signo);
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
  } else if (rounds_) {
    store_url_ = rounds_->rank_store(opt_.restart);
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
  // A signal between two starts, when no event loop read it.
  if (int signo = pending_signal()) {
    say("received " + signal_name(signo) + " before the ranks were started; the job ends here");
    return 128 + signo;
  }

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

  if (rounds_ && !stopping_) rounds_->watch(opt_.restart, [] { forward_to_loop(kPeerNews); });

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

  if (rounds_) rounds_->stop_watching();
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
  if (!mpi) remove_job_segments(job_id());

  // One the loop never read (it came as the last rank ended) counts as well.
  if (!interrupted_by_) interrupted_by_ = pending_signal();
  if (interrupted_by_) return 128 + interrupted_by_;
  return failed_ ? kExitFailure : 0;
}

// torchrun's --max-restarts: a failed start is followed by a new one, with a
// new store (one node), until one succeeds or the restarts are spent. A
// signal ends it at once. With several nodes the launchers restart together,
// each start a rendezvous round (launch_rounds.h).
int run_with_restarts(Options options, const std::string& node) {
  std::unique_ptr<Rounds> rounds;
  try {
    if (options.nnodes > 1 && options.max_restarts > 0) rounds = std::make_unique<Rounds>(options, node);
  } catch (const RoundsError& e) {
    say(e.message);
    return kExitFailure;
  }
  auto end = [&](int rc, const std::string& why) {
    if (rounds) rounds->leave(why);
    return rc;
  };
  const JobSignals signals;
  for (int start = 0;; ++start) {
    options.restart = start;
    try {
      if (rounds) rounds->join(start);
    } catch (const RoundsError& e) {
      say(e.message);
      return e.signo ? end(128 + e.signo, "received " + signal_name(e.signo)) : end(kExitFailure, e.message);
    }
    Launcher launcher(options, signals, rounds.get());
    int rc = launcher.run();
    std::string cause = launcher.failure().empty() ? "a rank could not be started" : launcher.failure();
    if (rc == 0 && rounds) {
      try {
        if (rounds->finish(start)) return end(0, "");
      } catch (const RoundsError& e) {
        say(e.message);
        return e.signo ? end(128 + e.signo, "received " + signal_name(e.signo)) : end(kExitFailure, e.message);
      }
      rc = kExitFailure;
      cause = rounds->news(nullptr);
      say("this node's ranks finished, but " + cause);
    }
    if (rc > 128) return end(rc, "received " + signal_name(rc - 128));
    if (rc != kExitFailure || options.max_restarts == 0) return end(rc, "");
    if (launcher.fatal()) return end(rc, "");
    // A rank's failure is published as it happens; this covers a rank that
    // could not be started (first one wins).
    if (rounds) rounds->report_failure(start, cause);
    if (start == options.max_restarts) {
      say("giving up after " + std::to_string(start) + " restart(s); the last failure: " + cause);
      return end(rc, "gave up after " + std::to_string(start) + " restart(s)");
    }
    say("restart " + std::to_string(start + 1) + " of " + std::to_string(options.max_restarts) + " after: " + cause);
  }
}

}  // namespace launcher

int launch_main(int argc, char** argv) {
  using namespace launcher;
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
  const std::string node = "node " + std::to_string(options.node_rank) + " of " + std::to_string(options.nnodes) +
                           (options.has_local_addr ? " (" + options.local_addr + ")" : "");
  if (options.nnodes > 1) say_as_node(node);
  remove_stale_segments();
  return run_with_restarts(options, node);
}

}  // namespace shardplan_cli
