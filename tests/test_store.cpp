// Rendezvous stores: c10d's TCPStore and FileStore behind shardplan::Store,
// the in-process memory store, make_store's URLs, the C view plugins get, and
// the one-line errors that name the address and the key.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "shardplan/error.h"
#include "shardplan/store.h"

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
  EXPECT_TRUE(contains(m, "cannot reach master 127.0.0.1:" + std::to_string(port))) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
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
