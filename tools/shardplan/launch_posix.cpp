// POSIX pieces of `shardplan launch`: writing, naming signals and wait
// statuses, the signal pipe, close-on-exec pipes, the store's temporary directory.
#include "launch_internal.h"

namespace shardplan_cli {
namespace launcher {

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

namespace {
std::string g_node;
}  // namespace

void say_as_node(const std::string& node) { g_node = node.empty() ? node : node + ": "; }

void say(const std::string& line) { write_all(STDERR_FILENO, "shardplan launch: " + g_node + line + "\n"); }

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

volatile sig_atomic_t g_signal_pipe_write = -1;

namespace {
volatile sig_atomic_t g_first_signal = 0;
}  // namespace

int pending_signal() { return g_first_signal; }

// Only forwards the signal number to the main loop: everything else is done
// there, outside signal context.
extern "C" void forward_to_loop(int signo) {
  int saved = errno;
  if ((signo == SIGINT || signo == SIGTERM || signo == SIGHUP) && g_first_signal == 0) g_first_signal = signo;
  unsigned char b = static_cast<unsigned char>(signo);
  const int fd = g_signal_pipe_write;
  if (fd >= 0) {
    ssize_t ignored = write(fd, &b, 1);
    (void)ignored;
  }
  errno = saved;
}

JobSignals::JobSignals() {
  for (int signo : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    SavedAction saved{signo, {}};
    if (sigaction(signo, nullptr, &saved.action) != 0) continue;
    saved_.push_back(saved);
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
}

JobSignals::~JobSignals() {
  for (const SavedAction& s : saved_) sigaction(s.signo, &s.action, nullptr);
}

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

namespace {

// ---------------------------------------------------------------- temp dir

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;
}

}  // namespace

TempDir::~TempDir() {
  if (!path_.empty()) nftw(path_.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

bool TempDir::create() {
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

}  // namespace launcher
}  // namespace shardplan_cli
