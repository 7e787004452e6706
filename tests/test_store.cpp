// Rendezvous stores: our TCP store (bound to the master address only, many
// clients, threads and processes, malformed frames, a server that dies),
// c10d's FileStore, the in-process memory store, make_store's URLs, the C
// view plugins get, and the one-line errors that name the address and the key.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/store.h"

namespace test_store {

namespace {

using namespace std::chrono_literals;
using shardplan::Error;
using shardplan::Store;
using Bytes = std::vector<uint8_t>;

// The kernel's pick of an unused port; nothing holds it afterwards.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string temp_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("shardplan-test-store-" + name + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Both ends of a store see each other's keys, and get() waits for a key set
// later by the other end.
void exercise_pair(Store& a, Store& b) {
  a.set("alpha", Bytes{1, 2, 3});
  EXPECT_EQ(b.get("alpha", 5s), (Bytes{1, 2, 3}));
  EXPECT_TRUE(b.check("alpha"));
  EXPECT_FALSE(b.check("beta"));
  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    b.set("beta", Bytes{});
  });
  EXPECT_EQ(a.get("beta", 10s), Bytes{});
  late.join();
  a.set("alpha", Bytes{9});  // overwrite
  EXPECT_EQ(b.get("alpha", 5s), Bytes{9});
}

TEST(Store, TcpSetGetAcrossTwoStores) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
  auto client = shardplan::make_tcp_store("127.0.0.1", port, false, 2, 10s);
  EXPECT_EQ(server->describe(), "tcp://127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(client->describe(), server->describe());
  exercise_pair(*server, *client);
}

TEST(Store, TcpGetTimeoutNamesKeyAndAddress) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 1, 10s);
  auto t0 = std::chrono::steady_clock::now();
  std::string m = message_of([&] { server->get("gloo/0/1", 300ms); });
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(m, "rendezvous timed out after 300 ms waiting for key 'gloo/0/1' at tcp://127.0.0.1:" +
                   std::to_string(port));
  EXPECT_LT(took, 5s);
  // The client stays usable after a timeout.
  server->set("gloo/0/1", Bytes{7});
  EXPECT_EQ(server->get("gloo/0/1", 1s), Bytes{7});
}

TEST(Store, TcpPortInUse) {
  int port = free_port();
  auto first = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 5s);
  std::string m = message_of([&] { shardplan::make_tcp_store("127.0.0.1", port, true, 2, 5s); });
  EXPECT_EQ(m, "port " + std::to_string(port) + " already in use on 127.0.0.1");
}

TEST(Store, TcpCannotReachMaster) {
  int port = free_port();  // nobody listens there
  auto t0 = std::chrono::steady_clock::now();
  std::string m = message_of([&] { shardplan::make_tcp_store("127.0.0.1", port, false, 2, 1s); });
  EXPECT_EQ(m, "cannot reach master tcp://127.0.0.1:" + std::to_string(port) + " within 1000 ms: connection refused");
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

// ------------------------------------------------- TCP: where it listens

// Addresses (hex, as the kernel writes them) listening on `port`, from
// /proc/net/tcp and /proc/net/tcp6.
std::set<std::string> listening_on(int port) {
  std::set<std::string> out;
  char port_hex[8];
  std::snprintf(port_hex, sizeof port_hex, "%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos && local.substr(colon + 1) == port_hex)
        out.insert(local.substr(0, colon));
    }
  }
  return out;
}

// errno of a plain connect() to addr:port (0: it connected).
int connect_errno(const std::string& addr, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  int err = rc == 0 ? 0 : errno;
  ::close(fd);
  return err;
}

// The machine's IPv4 addresses outside 127/8 (none on an isolated box).
std::vector<std::string> other_local_ipv4() {
  std::vector<std::string> out;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return out;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) out.push_back(text);
  }
  ::freeifaddrs(all);
  return out;
}

TEST(Store, TcpListensOnlyOnTheMasterAddress) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
  EXPECT_EQ(listening_on(port), std::set<std::string>{"0100007F"});  // 127.0.0.1, not 0.0.0.0 nor ::
  EXPECT_EQ(connect_errno("127.0.0.1", port), 0);
  // 127.0.0.2 is this machine too (all of 127/8 is), but not the master address.
  EXPECT_EQ(connect_errno("127.0.0.2", port), ECONNREFUSED);
  for (const std::string& ip : other_local_ipv4()) EXPECT_EQ(connect_errno(ip, port), ECONNREFUSED) << ip;
  std::string m = message_of([&] { shardplan::make_tcp_store("127.0.0.2", port, false, 2, 300ms); });
  EXPECT_EQ(m, "cannot reach master tcp://127.0.0.2:" + std::to_string(port) + " within 300 ms: connection refused");

  // "localhost" is 127.0.0.1 on both ends, never ::1 or every interface.
  int port2 = free_port();
  auto local = shardplan::make_tcp_store("localhost", port2, true, 2, 10s);
  auto peer = shardplan::make_tcp_store("localhost", port2, false, 2, 10s);
  EXPECT_EQ(listening_on(port2), std::set<std::string>{"0100007F"});
  EXPECT_EQ(peer->describe(), "tcp://localhost:" + std::to_string(port2));
  exercise_pair(*local, *peer);
}

TEST(Store, TcpMasterAddressMustBeLocalUnlessEveryInterfaceIsAskedFor) {
  int port = free_port();
  // 192.0.2.0/24 is reserved for documentation: no machine has it.
  std::string m = message_of([&] { shardplan::make_tcp_store("192.0.2.1", port, true, 2, 1s); });
  EXPECT_EQ(m, "cannot serve the rendezvous store on tcp://192.0.2.1:" + std::to_string(port) +
                   ": 192.0.2.1 is not an address of this machine (the master address must be one of the "
                   "master node's own; 0.0.0.0 listens on every interface)");
  // The explicit opt-in: every IPv4 interface.
  auto server = shardplan::make_tcp_store("0.0.0.0", port, true, 2, 10s);
  EXPECT_EQ(listening_on(port), std::set<std::string>{"00000000"});
  auto client = shardplan::make_tcp_store("127.0.0.1", port, false, 2, 10s);
  exercise_pair(*server, *client);
}

// ------------------------------------------- TCP: threads and processes

TEST(Store, TcpManyThreadsAndClients) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 9, 10s);
  auto shared = shardplan::make_tcp_store("127.0.0.1", port, false, 9, 10s);
  constexpr int kThreads = 8;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      // Half share one client: a get blocked on it must not hold up the
      // others' sets. The rest have a client each.
      auto own = i % 2 ? shardplan::make_tcp_store("127.0.0.1", port, false, 9, 10s) : shared;
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * (kThreads - i)));
      own->set("t/" + std::to_string(i), Bytes{static_cast<uint8_t>(i)});
      bool all = true;
      for (int j = 0; j < kThreads; ++j) all = all && own->get("t/" + std::to_string(j), 10s) == Bytes{uint8_t(j)};
      if (all) ++good;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads);
  EXPECT_TRUE(server->check("t/7"));
}

TEST(Store, TcpAcrossProcesses) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 4, 10s);
  std::vector<pid_t> kids;
  for (int rank = 1; rank < 4; ++rank) {
    pid_t pid = ::fork();
    if (pid == 0) {
      int rc = 0;
      try {
        auto s = shardplan::make_tcp_store("127.0.0.1", port, false, 4, 10s);
        s->set("p/" + std::to_string(rank), Bytes{static_cast<uint8_t>(rank)});
        for (int j = 0; j < 4; ++j)
          if (s->get("p/" + std::to_string(j), 10s) != Bytes{uint8_t(j)}) rc = 1;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        rc = 2;
      }
      ::_exit(rc);
    }
    kids.push_back(pid);
  }
  server->set("p/0", Bytes{0});
  for (int j = 1; j < 4; ++j) EXPECT_EQ(server->get("p/" + std::to_string(j), 10s), Bytes{uint8_t(j)});
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
}

TEST(Store, TcpGetFailsFastWhenTheServerDies) {
  int port = free_port();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t server_pid = ::fork();
  if (server_pid == 0) {  // rank 0's process
    auto s = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
    s->set("up", Bytes{1});
    char c = 1;
    ssize_t n = ::write(ready[1], &c, 1);
    (void)n;
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  auto client = shardplan::make_tcp_store("127.0.0.1", port, false, 2, 10s);
  EXPECT_EQ(client->get("up", 5s), Bytes{1});
  std::string m;
  auto t0 = std::chrono::steady_clock::now();
  std::thread blocked([&] { m = message_of([&] { client->get("never", 60s); }); });
  std::this_thread::sleep_for(200ms);
  ::kill(server_pid, SIGKILL);
  ::waitpid(server_pid, nullptr, 0);
  blocked.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);  // not the 60 s it asked for
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  EXPECT_EQ(m, "store " + url +
                   ": lost the connection to the server (world rank 0) while waiting for key 'never': "
                   "the server closed the connection");
  // Later requests fail at once too.
  t0 = std::chrono::steady_clock::now();
  m = message_of([&] { client->set("k", Bytes{}); });
  EXPECT_EQ(m, "store " + url +
                   ": cannot connect while setting key 'k': connection refused (has world rank 0, which serves "
                   "the store, exited?)");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(Store, TcpServerOutlivesItsOwnerWhilePeersRemain) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
  auto client = shardplan::make_tcp_store("127.0.0.1", port, false, 2, 10s);
  server->set("a", Bytes{1});
  server.reset();  // rank 0 done first: the others still meet through it
  EXPECT_EQ(client->get("a", 5s), Bytes{1});
  client->set("b", Bytes{2});
  EXPECT_EQ(client->get("b", 5s), Bytes{2});
  client.reset();  // the last peer gone: the server ends and frees the port
  auto t0 = std::chrono::steady_clock::now();
  while (!listening_on(port).empty() && std::chrono::steady_clock::now() - t0 < 5s)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(listening_on(port).empty());
  auto again = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
  EXPECT_FALSE(again->check("a"));
}

// ------------------------------------------------ TCP: hostile peers

// A raw connection, for what our client never sends.
class Raw {
 public:
  explicit Raw(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~Raw() { ::close(fd_); }
  void send(const Bytes& b) { EXPECT_EQ(::send(fd_, b.data(), b.size(), MSG_NOSIGNAL), ssize_t(b.size())); }
  // Everything until the server closes the connection ("<open>" appended
  // when it has not within `wait`).
  std::string until_closed(std::chrono::milliseconds wait = 5s) {
    std::string got;
    auto deadline = std::chrono::steady_clock::now() + wait;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return got + "<open>";
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return got;
      got.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_;
};

void put32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}

// u8 op | u32 key_len | u32 value_len | key | value (tcp_store.h)
Bytes frame(uint8_t op, const std::string& key, const Bytes& value, uint32_t key_len = ~0u, uint32_t value_len = ~0u) {
  Bytes b{op};
  put32(b, key_len == ~0u ? static_cast<uint32_t>(key.size()) : key_len);
  put32(b, value_len == ~0u ? static_cast<uint32_t>(value.size()) : value_len);
  b.insert(b.end(), key.begin(), key.end());
  b.insert(b.end(), value.begin(), value.end());
  return b;
}

Bytes hello(uint32_t version = 1) {
  Bytes v;
  put32(v, version);
  return frame(1, "shardplan-store", v);
}

// The ERROR reply: status 2, length, message.
std::string error_reply(const std::string& msg) {
  Bytes b{2};
  put32(b, static_cast<uint32_t>(msg.size()));
  return std::string(b.begin(), b.end()) + msg;
}

const std::string kOkEmpty("\0\0\0\0\0", 5);

TEST(Store, TcpRefusesMalformedFramesAndKeepsServing) {
  int port = free_port();
  auto server = shardplan::make_tcp_store("127.0.0.1", port, true, 2, 10s);
  // Peers that connect and say nothing, or stop halfway through a frame,
  // hold up nobody.
  Raw silent(port), halfway(port);
  halfway.send(Bytes{1, 0, 0});
  auto client = shardplan::make_tcp_store("127.0.0.1", port, false, 2, 2s);
  client->set("k", Bytes{5});
  EXPECT_EQ(server->get("k", 2s), Bytes{5});

  {
    Raw http(port);
    std::string req = "GET / HTTP/1.0\r\n\r\n";
    http.send(Bytes(req.begin(), req.end()));
    EXPECT_EQ(http.until_closed(), error_reply("unknown request type 71 (not a shardplan store client?)"));
  }
  {
    Raw skip(port);
    skip.send(frame(2, "k", Bytes{1}));
    EXPECT_EQ(skip.until_closed(), error_reply("the first request must be HELLO"));
  }
  {
    Raw old(port);
    old.send(hello(7));
    EXPECT_EQ(old.until_closed(),
              error_reply("store protocol version 7, this server speaks 1 (mixed shardplan versions?)"));
  }
  {
    Raw big_key(port);
    big_key.send(hello());
    big_key.send(frame(2, "", {}, 1u << 30, 0));  // announces 1 GiB of key, sends none
    EXPECT_EQ(big_key.until_closed(), kOkEmpty + error_reply("key of 1073741824 bytes, over the limit of 4096"));
  }
  {
    Raw big_value(port);
    big_value.send(hello());
    big_value.send(frame(2, "k", {}, ~0u, 1u << 31));
    EXPECT_EQ(big_value.until_closed(), kOkEmpty + error_reply("value of 2147483648 bytes, over the limit of 67108864"));
  }
  {
    Raw odd_get(port);
    odd_get.send(hello());
    odd_get.send(frame(3, "k", Bytes{1, 2}));  // GET's value is its 8-byte timeout
    EXPECT_EQ(odd_get.until_closed(), kOkEmpty + error_reply("request type 3 with a value of 2 bytes"));
  }
  // Our client refuses before sending.
  EXPECT_TRUE(contains(message_of([&] { client->set(std::string(5000, 'k'), Bytes{}); }),
                       ": key of 5000 bytes, over the limit of 4096"));
  // Still serving, the silent and the halfway peers still connected.
  EXPECT_EQ(silent.until_closed(50ms), "<open>");
  EXPECT_EQ(halfway.until_closed(50ms), "<open>");
  client->set("k", Bytes{6});
  EXPECT_EQ(server->get("k", 2s), Bytes{6});
}

TEST(Store, FileSetGetAcrossTwoStores) {
  std::string dir = temp_dir("file");
  std::string path = dir + "/sub/store";  // missing parents are created
  auto a = shardplan::make_file_store(path, 2, 10s);
  auto b = shardplan::make_file_store(path, 2, 10s);
  EXPECT_EQ(a->describe(), "file://" + path);
  // A lookup before anyone wrote must answer at once, not wait for the file.
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(a->check("nothing-yet"));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);  // far below the 10 s store timeout it must not wait for
  exercise_pair(*a, *b);
  std::string m = message_of([&] { a->get("missing", 200ms); });
  EXPECT_EQ(m, "rendezvous timed out after 200 ms waiting for key 'missing' at file://" + path);
  a.reset();
  b.reset();
  std::filesystem::remove_all(dir);
}

TEST(Store, MemoryStoreAcrossThreads) {
  auto s = shardplan::make_memory_store();
  exercise_pair(*s, *s);
  EXPECT_EQ(s->describe().rfind("memory://", 0), 0u);
  std::string m = message_of([&] { s->get("k", 50ms); });
  EXPECT_TRUE(contains(m, "rendezvous timed out after 50 ms waiting for key 'k' at memory://")) << m;
  // Two memory stores are separate worlds.
  auto other = shardplan::make_memory_store();
  EXPECT_FALSE(other->check("alpha"));
}

TEST(Store, MakeStoreUrls) {
  int port = free_port();
  std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  auto server = shardplan::make_store(url, 0, 2, 10s);  // rank 0 serves
  auto client = shardplan::make_store(url, 1, 2, 10s);
  EXPECT_EQ(server->describe(), url);
  exercise_pair(*server, *client);

  std::string dir = temp_dir("url");
  auto f0 = shardplan::make_store("file://" + dir + "/store", 0, 2, 10s);
  auto f1 = shardplan::make_store("file://" + dir + "/store", 1, 2, 10s);
  EXPECT_EQ(f0->describe(), "file://" + dir + "/store");
  exercise_pair(*f0, *f1);
  f0.reset();
  f1.reset();
  std::filesystem::remove_all(dir);

  EXPECT_TRUE(contains(message_of([] { shardplan::make_store("http://x:1", 0, 1, 1s); }), "'http://x:1'"));
  EXPECT_TRUE(contains(message_of([] { shardplan::make_store("tcp://:29500", 0, 1, 1s); }), "no host"));
  EXPECT_TRUE(contains(message_of([] { shardplan::make_store("tcp://h:99999", 0, 1, 1s); }), "bad port"));
  EXPECT_TRUE(contains(message_of([] { shardplan::make_store("file://relative", 0, 1, 1s); }), "absolute path"));
}

// tcp://HOST:PORT/PATH: keys under PATH/ of a store another process serves
// (shardplan launch's node 0 with --max-restarts): no rank serves, not even
// rank 0, and rounds under other paths do not see each other's keys.
TEST(Store, MakeStoreUrlPath) {
  int port = free_port();
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port);
  auto served = shardplan::make_store(url, 0, 2, 10s);
  auto r0 = shardplan::make_store(url + "/worker/attempt_1", 0, 2, 10s);
  auto r1 = shardplan::make_store(url + "/worker/attempt_1", 1, 2, 10s);
  EXPECT_EQ(r0->describe(), url + "/worker/attempt_1");
  exercise_pair(*r0, *r1);
  EXPECT_TRUE(served->check("worker/attempt_1/alpha"));
  EXPECT_FALSE(shardplan::make_store(url + "/worker/attempt_2", 1, 2, 10s)->check("alpha"));
  EXPECT_TRUE(contains(message_of([] { shardplan::make_store("tcp://h:1//x", 0, 1, 1s); }), "bad key path '/x'"));
}

// What a plugin sees: C callbacks, malloc'd values, statuses, last_error.
TEST(Store, CView) {
  auto s = shardplan::make_memory_store();
  const sp_store* c = s->abi();
  ASSERT_NE(c, nullptr);
  const char hello[] = "hello";
  EXPECT_EQ(c->set(c->ctx, "k", hello, 5), SP_OK);
  void* data = nullptr;
  size_t len = 0;
  ASSERT_EQ(c->get(c->ctx, "k", &data, &len, 1000), SP_OK);
  ASSERT_EQ(len, 5u);
  EXPECT_EQ(std::string(static_cast<char*>(data), len), "hello");
  std::free(data);

  // An empty value is still a non-NULL allocation.
  EXPECT_EQ(c->set(c->ctx, "empty", nullptr, 0), SP_OK);
  ASSERT_EQ(c->get(c->ctx, "empty", &data, &len, 1000), SP_OK);
  EXPECT_NE(data, nullptr);
  EXPECT_EQ(len, 0u);
  std::free(data);

  int exists = -1;
  EXPECT_EQ(c->check(c->ctx, "k", &exists), SP_OK);
  EXPECT_EQ(exists, 1);
  EXPECT_EQ(c->check(c->ctx, "nope", &exists), SP_OK);
  EXPECT_EQ(exists, 0);

  EXPECT_EQ(c->get(c->ctx, "nope", &data, &len, 20), SP_ERR_TIMEOUT);
  EXPECT_TRUE(contains(c->last_error(c->ctx), "'nope'")) << c->last_error(c->ctx);
}

}  // namespace

}  // namespace test_store
