// fault_probe: a rank for the runtime-fault tests (tests/faults/faults_test.sh).
// It joins the launcher's world with the framework's own init_world, so the
// errors it prints are the ones a training program would print. Actions run
// in command-line order; see kUsage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "shardplan/mesh.h"
#include "shardplan/world.h"

namespace {

const char* const kUsage =
    "usage: fault_probe ACTION...   (actions run in order)\n"
    "  --init                    join the world (WorldOptions::from_env()), print 'rank R joined'\n"
    "  --collective NAME         all_reduce | all_gather | broadcast | barrier on the current group,\n"
    "                            print 'rank R: NAME done'\n"
    "  --describe                print 'rank R of W, local L of N, threads <setting>' (after --init)\n"
    "  --group AXIS              later collectives use the group of AXIS in a one-axis mesh\n"
    "                            {AXIS: world size} (\"world\": the world again)\n"
    "  --sleep-ms MS             sleep\n"
    "  --hold-port PORT          listen on 127.0.0.1:PORT (a port another job holds), print\n"
    "                            'holding PORT', sleep 300 s\n"
    "  --if-rank R ACTION        run the next action only when RANK is R\n"
    "Errors print 'fault_probe: error: <message>' on stderr and exit 1.\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "fault_probe: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

long to_long(const std::string& action, const std::string& v) {
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end) usage_error(action + " needs a number, got '" + v + "'");
  return x;
}

void hold_port(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || listen(fd, 16) != 0) {
    std::perror("fault_probe: --hold-port");
    std::exit(1);
  }
  std::printf("holding %d\n", port);
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::seconds(300));
  close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* rank_env = std::getenv("RANK");
  if (!rank_env) rank_env = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string rank = rank_env ? rank_env : "none";
  std::shared_ptr<shardplan::World> world;
  std::shared_ptr<shardplan::Communicator> group;
  try {
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
      auto need_world = [&] {
        if (!world) usage_error(action + " needs --init first");
      };
      if (action == "--help") {
        std::fputs(kUsage, stdout);
        return 0;
      } else if (action == "--init") {
        if (!run) continue;
        world = shardplan::init_world(shardplan::WorldOptions::from_env());
        group = world->comm_ptr();
        std::printf("rank %d joined\n", world->rank());
      } else if (action == "--describe") {
        if (!run) continue;
        need_world();
        const shardplan::WorldOptions& o = world->options();
        std::printf("rank %d of %d, local %d of %d, threads %s\n", world->rank(), world->size(), o.local_rank,
                    o.local_world_size, world->threads().str().c_str());
      } else if (action == "--group") {
        const std::string axis = arg();
        if (!run) continue;
        need_world();
        group = axis == "world" ? world->comm_ptr()
                                : world->group(shardplan::Mesh({{axis, world->size()}}), axis);
      } else if (action == "--collective") {
        const std::string name = arg();
        if (!run) continue;
        need_world();
        at::Tensor t = at::full({4}, static_cast<double>(world->rank() + 1), at::kFloat);
        if (name == "all_reduce")
          group->all_reduce(t);
        else if (name == "all_gather")
          group->all_gather(t);
        else if (name == "broadcast")
          group->broadcast(t, 0);
        else if (name == "barrier")
          group->barrier();
        else
          usage_error("unknown collective '" + name + "'");
        std::printf("rank %d: %s done\n", world->rank(), name.c_str());
      } else if (action == "--sleep-ms") {
        const long ms = to_long(action, arg());
        if (!run) continue;
        std::fflush(nullptr);
        std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      } else if (action == "--hold-port") {
        const long port = to_long(action, arg());
        if (run) hold_port(static_cast<int>(port));
      } else {
        usage_error("unknown action '" + action + "'");
      }
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "fault_probe: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
