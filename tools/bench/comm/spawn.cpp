#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace shardplan_bench {

namespace {

using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_interrupted = 0;

void on_signal(int) { g_interrupted = 1; }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "ended with status " + std::to_string(status);
}

pid_t start(const Process& p, const std::vector<std::string>& env, int out_fd, pid_t group) {
  std::vector<char*> argv;
  for (const std::string& a : p.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::setpgid(0, group);
    // Orphaned ranks would keep a port or a GPU busy; go with the bench.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(out_fd, STDOUT_FILENO);
    for (const std::string& kv : env) ::putenv(const_cast<char*>(kv.c_str()));
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "shardplan bench comm: cannot run %s: %s\n", argv[0], ::strerror(errno));
    ::_exit(127);
  }
  ::setpgid(pid, group);  // also here: whichever runs first wins the race
  return pid;
}

}  // namespace

void install_interrupt_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  ::sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_interrupted != 0; }

SpawnResult run_processes(const std::vector<Process>& procs, const std::vector<std::string>& env,
                          std::chrono::milliseconds silence_limit,
                          const std::function<void(const std::string&)>& on_line) {
  SpawnResult result;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.error = std::string("pipe: ") + ::strerror(errno);
    return result;
  }
  std::vector<pid_t> pids;
  std::vector<bool> running;
  pid_t group = 0;
  for (const Process& p : procs) {
    const pid_t pid = start(p, env, fds[1], group);
    if (pid < 0) {
      result.error = std::string("fork: ") + ::strerror(errno);
      break;
    }
    if (group == 0) group = pid;
    pids.push_back(pid);
    running.push_back(true);
  }
  ::close(fds[1]);

  std::string pending, failure;
  std::vector<std::string> failures;  // ranks that failed on their own, in the order they were reaped
  bool stopping = false;              // we are killing the rest: their deaths are ours
  bool eof = false;
  auto last_output = Clock::now();
  size_t alive = pids.size();
  auto reap = [&](bool block) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (!running[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, block ? 0 : WNOHANG) != pids[i]) continue;
      running[i] = false;
      --alive;
      const bool good = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (!good && !stopping) failures.push_back(procs[i].label + " " + describe_status(status));
    }
  };

  while (result.error.empty() && failure.empty() && (alive > 0 || !eof)) {
    if (g_interrupted) {
      failure = "interrupted";
      break;
    }
    if (!eof) {
      pollfd pfd{fds[0], POLLIN, 0};
      if (::poll(&pfd, 1, 100) > 0) {
        char buf[65536];
        const ssize_t n = ::read(fds[0], buf, sizeof buf);
        if (n > 0) {
          last_output = Clock::now();
          pending.append(buf, static_cast<size_t>(n));
          for (size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
            on_line(pending.substr(0, nl));
            pending.erase(0, nl + 1);
          }
        } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
          eof = true;
        }
      }
    } else {
      ::usleep(20000);
    }
    reap(false);
    // A descendant outside our control (an MPI daemon) may keep the pipe
    // open; once every process we started is gone, stop listening soon.
    if (alive == 0 && !eof && Clock::now() - last_output > std::chrono::seconds(2)) eof = true;
    if (Clock::now() - last_output > silence_limit)
      failure = "no progress for " + std::to_string(silence_limit.count() / 1000) + " s";
    if (!failures.empty() && failure.empty()) {
      // When one rank dies its peers fail too, on the broken connection,
      // and which of them is reaped first is chance. Give them a moment to
      // exit, then name every rank that failed by itself, so the root cause
      // (the rank that died) is always in the message.
      const auto grace = Clock::now() + std::chrono::seconds(1);
      while (alive > 0 && Clock::now() < grace) {
        ::usleep(20000);
        reap(false);
      }
      for (const auto& f : failures) failure += (failure.empty() ? "" : "; ") + f;
    }
  }

  if (failure.empty())
    for (const auto& f : failures) failure += (failure.empty() ? "" : "; ") + f;
  stopping = true;
  if (alive > 0 && group > 0) {
    // Polite first: mpirun passes SIGTERM on to its ranks.
    ::kill(-group, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(3);
    while (alive > 0 && Clock::now() < deadline) {
      ::usleep(20000);
      reap(false);
    }
    if (alive > 0) ::kill(-group, SIGKILL);
    reap(true);
  }
  ::close(fds[0]);
  if (result.error.empty() && !failure.empty()) result.error = failure;
  result.ok = result.error.empty();
  return result;
}

}  // namespace shardplan_bench
