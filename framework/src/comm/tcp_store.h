#pragma once
// The framework's own TCP rendezvous store (torch-free, plain POSIX sockets):
// world rank 0 serves it, every rank (rank 0 too) is a client. It replaces
// c10d::TCPStore, which in libtorch 1.13 cannot be told where to listen and so
// served every interface. The server binds exactly the master address.
//
// The store is unauthenticated, like torchrun's: whoever reaches the port can
// read and write keys. It must be confined to a network only the job's hosts
// reach (docs/ARCHITECTURE.md, "Ranks, launch and rendezvous").
//
// Wire format, every integer big-endian. A request is
//   u8 op | u32 key_len | u32 value_len | key | value
// and a reply
//   u8 status | u32 len | payload.
// A connection's first request must be HELLO (key kMagic, value the u32
// protocol version) within kHelloWindow. GET carries its timeout as a u64 of
// milliseconds in the value and the server answers at the latest when it runs
// out, so a request and its reply always stay paired. A malformed frame gets
// an ERROR reply naming the fault and the connection is closed.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace shardplan::tcp_store {

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kCheck = 4 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kFailed = 2 };

constexpr char kMagic[] = "shardplan-store";
constexpr uint32_t kVersion = 1;
constexpr size_t kRequestHeader = 9;
constexpr size_t kReplyHeader = 5;
// Rendezvous keys and values are small (addresses, ids, sizes); the limits
// keep one peer from making the server hold gigabytes.
constexpr uint32_t kMaxKey = 4096;
constexpr uint32_t kMaxValue = 64u << 20;
constexpr uint64_t kMaxStoreBytes = uint64_t(1) << 30;
constexpr size_t kMaxConnections = 4096;
// A connection must say HELLO, and finish any frame it started, within this
// long; otherwise it is closed (a port scanner, a stuck or hostile peer).
constexpr std::chrono::milliseconds kHelloWindow{10000};
constexpr std::chrono::milliseconds kFrameWindow{10000};

// ------------------------------------------------------------- addresses

struct Endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;
  std::string numeric() const;  // "127.0.0.1", "::1"
};

// "localhost" is 127.0.0.1 on both ends, so a loopback master never listens
// on, or connects to, anything else. Throws Error naming host:port.
std::vector<Endpoint> resolve(const std::string& host, int port);
// Throws Error when `host` is a name (not a numeric address, not
// "localhost") whose every address is loopback here: Debian's /etc/hosts
// maps the host name to 127.0.1.1, and a master bound there is reachable
// from no other node, which would wait out their whole timeout.
void refuse_loopback_name(const std::string& host, int port, const std::vector<Endpoint>& endpoints);
// "tcp://host:port", with [] around an IPv6 host.
std::string url(const std::string& host, int port);
std::string errno_text(int err);

// Big-endian framing.
void put_u32(std::vector<uint8_t>& out, uint32_t v);
void put_u64(std::vector<uint8_t>& out, uint64_t v);
uint32_t get_u32(const uint8_t* p);
uint64_t get_u64(const uint8_t* p);
// A whole request (header, key, value) or reply (header, payload).
std::vector<uint8_t> request_frame(Op op, const std::string& key, const std::vector<uint8_t>& value);
void append_reply(std::vector<uint8_t>& out, Status status, const uint8_t* data, size_t len);

// ---------------------------------------------------------------- server

class Server {
 public:
  // Binds every address `host` resolves to (only those) and starts serving
  // on a thread of its own. Throws Error: "port P already in use on HOST",
  // or "cannot serve the rendezvous store on tcp://HOST:P: ...".
  static std::shared_ptr<Server> start(const std::string& host, int port);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  // The owner is done with it. Peers may still be talking to it (rank 0
  // finishing before the others): it serves until the last one has gone,
  // or until the process exits, then its thread is joined.
  static void release(std::shared_ptr<Server> server);

  struct State;

 private:
  Server() = default;
  void stop();  // ends the thread and joins it; idempotent

  int port_ = 0;
  std::unique_ptr<State> state_;
  friend struct Registry;
};

// ---------------------------------------------------------------- client

class Client {
 public:
  // Connects within `timeout`, retrying while nobody listens yet (the
  // server's rank may start later). Throws Error "cannot reach master
  // tcp://HOST:P within N ms: REASON".
  Client(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void set(const std::string& key, const std::vector<uint8_t>& value);
  // nullopt when the key did not appear within `timeout`.
  std::optional<std::vector<uint8_t>> get(const std::string& key, std::chrono::milliseconds timeout);
  bool check(const std::string& key);
  const std::string& describe() const { return url_; }

 private:
  struct Reply {
    Status status;
    std::vector<uint8_t> payload;
  };
  class Conn;
  // One request at a time per connection; concurrent callers each get one
  // of their own (a blocked get must not hold up another thread's set).
  Reply request(Op op, const std::string& key, const std::vector<uint8_t>& value,
                std::chrono::milliseconds reply_within, const std::string& doing);
  std::unique_ptr<Conn> take(const std::string& doing);
  void hello(Conn& conn, std::chrono::steady_clock::time_point deadline);
  void give_back(std::unique_ptr<Conn> conn);

  std::string host_;
  int port_;
  std::string url_;
  std::vector<Endpoint> endpoints_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::vector<std::unique_ptr<Conn>> idle_;
};

}  // namespace shardplan::tcp_store
