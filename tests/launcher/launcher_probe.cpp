// launcher_probe: a torch-free stand-in for a rank, driven by the tests of
// `shardplan launch`. Actions run in command-line order; see kUsage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* const kUsage =
    "usage: launcher_probe ACTION...   (actions run in order)\n"
    "  --free-port          print a TCP port that is free right now, exit 0\n"
    "  --env                print KEY=value (or KEY=<unset>) for the launcher's variables,\n"
    "                       then STORE_DIR=exists|missing|n/a for a file:// store\n"
    "  --print-env NAME     print NAME=value (or NAME=<unset>)\n"
    "  --pidfile DIR        write this pid to DIR/rank<RANK>.pid\n"
    "  --grandchild DIR     fork a child sleeping 300 s (it keeps stdout/stderr open);\n"
    "                       its pid goes to DIR/grandchild<RANK>.pid\n"
    "  --ignore-term        ignore SIGTERM from now on\n"
    "  --lines N            print N numbered lines to stdout, in chunks that split lines\n"
    "  --err-lines N        the same on stderr\n"
    "  --partial TEXT       print TEXT to stdout without a newline\n"
    "  --sleep-ms MS        sleep\n"
    "  --exit CODE          exit with CODE\n"
    "  --kill SIG           kill itself with signal number SIG\n"
    "  --if-rank R ACTION   run the next action only when RANK is R\n";

const char* const kEnvKeys[] = {"RANK",          "WORLD_SIZE",        "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE", "GROUP_RANK",     "GROUP_WORLD_SIZE",
                                "MASTER_ADDR",   "MASTER_PORT",       "SHARDPLAN_BACKEND",
                                "SHARDPLAN_STORE", "SHARDPLAN_LOCAL_ADDR", "SHARDPLAN_TIMEOUT_MS"};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "launcher_probe: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n <= 0) return;
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// Chunk size coprime to the line lengths, so nearly every write() ends in the
// middle of a line and the launcher has to reassemble lines.
void write_numbered_lines(int fd, const std::string& rank, const char* kind, long n) {
  std::string all;
  for (long i = 0; i < n; ++i)
    all += "rank " + rank + " " + kind + " " + std::to_string(i) + " " +
           std::string(static_cast<size_t>((i * 37) % 151), 'x') + "\n";
  for (size_t off = 0; off < all.size(); off += 997)
    write_all(fd, all.data() + off, std::min<size_t>(997, all.size() - off));
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) usage_error("cannot write " + tmp);
  std::fputs(text.c_str(), f);
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());  // readers never see a half-written pid
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("launcher_probe: --free-port");
    std::exit(1);
  }
  close(fd);
  return ntohs(addr.sin_port);
}

void print_env() {
  for (const char* key : kEnvKeys) {
    const char* v = std::getenv(key);
    std::printf("%s=%s\n", key, v ? v : "<unset>");
  }
  const char* store = std::getenv("SHARDPLAN_STORE");
  std::string status = "n/a";
  if (store && std::strncmp(store, "file://", 7) == 0) {
    std::string path = store + 7;
    std::string dir = path.substr(0, path.rfind('/'));
    struct stat st;
    status = stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) ? "exists" : "missing";
  }
  std::printf("STORE_DIR=%s\n", status.c_str());
}

long to_long(const std::string& action, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end) usage_error(action + " needs a number, got '" + v + "'");
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  // Under `shardplan launch --backend mpi` the rank comes from mpirun.
  if (!rank_env) rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string rank = rank_env ? rank_env : "none";
  for (int i = 1; i < argc; ++i) {
    std::string action = argv[i];
    bool run = true;
    if (action == "--if-rank") {
      if (i + 2 >= argc) usage_error("--if-rank needs a rank and an action");
      run = rank == argv[i + 1];
      i += 2;
      action = argv[i];
    }
    auto arg = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(action + " needs a value");
      return argv[++i];
    };
    if (action == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (action == "--free-port") {
      if (run) {
        std::printf("%d\n", free_port());
        return 0;
      }
    } else if (action == "--env") {
      if (run) print_env();
    } else if (action == "--print-env") {
      std::string name = arg();
      const char* v = std::getenv(name.c_str());
      if (run) std::printf("%s=%s\n", name.c_str(), v ? v : "<unset>");
    } else if (action == "--pidfile") {
      std::string dir = arg();
      if (run) write_file(dir + "/rank" + rank + ".pid", std::to_string(getpid()) + "\n");
    } else if (action == "--grandchild") {
      std::string dir = arg();
      if (run) {
        std::fflush(nullptr);
        pid_t pid = fork();
        if (pid == 0) {
          std::this_thread::sleep_for(std::chrono::seconds(300));
          _exit(0);
        }
        write_file(dir + "/grandchild" + rank + ".pid", std::to_string(pid) + "\n");
      }
    } else if (action == "--ignore-term") {
      if (run) signal(SIGTERM, SIG_IGN);
    } else if (action == "--lines" || action == "--err-lines") {
      long n = to_long(action, arg());
      if (run) {
        std::fflush(nullptr);
        if (action == "--lines")
          write_numbered_lines(1, rank, "line", n);
        else
          write_numbered_lines(2, rank, "err", n);
      }
    } else if (action == "--partial") {
      std::string text = arg();
      if (run) {
        std::fflush(nullptr);
        write_all(1, text.data(), text.size());
      }
    } else if (action == "--sleep-ms") {
      long ms = to_long(action, arg());
      if (run) {
        std::fflush(nullptr);
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      }
    } else if (action == "--exit") {
      long code = to_long(action, arg());
      if (run) {
        std::fflush(nullptr);
        std::exit(static_cast<int>(code));
      }
    } else if (action == "--kill") {
      long sig = to_long(action, arg());
      if (run) {
        std::fflush(nullptr);
        signal(static_cast<int>(sig), SIG_DFL);
        kill(getpid(), static_cast<int>(sig));
        std::this_thread::sleep_for(std::chrono::seconds(5));
        _exit(99);  // the signal did not kill us
      }
    } else {
      usage_error("unknown action '" + action + "'");
    }
  }
  std::fflush(nullptr);
  return 0;
}
