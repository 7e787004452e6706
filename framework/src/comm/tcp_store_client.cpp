// The TCP store's client: a small pool of connections to the server, each
// carrying one request at a time, so a thread blocked in get() never holds
// up another thread's set() on the same store.
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>

#include "shardplan/error.h"
#include "tcp_store.h"

namespace shardplan::tcp_store {

namespace {

using Clock = std::chrono::steady_clock;

// The server closed or reset the connection: its process is gone.
struct Lost {
  std::string why;
};
// No whole reply before the deadline.
struct NoReply {};
// The peer does not speak the protocol.
struct Garbled {
  std::string why;
};

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left + 1, 0, 1 << 30));
}

// false when the deadline passed first.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) {
      if (Clock::now() >= deadline) return false;
      continue;
    }
    if (errno != EINTR) throw Lost{errno_text(errno)};
  }
}

std::string describe_loss(int err) {
  return err == 0 ? "the server closed the connection" : errno_text(err);
}

// A connected socket, or -1 with `err` set.
int try_connect(const Endpoint& e, Clock::time_point deadline, int& err) {
  int fd = ::socket(e.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    err = errno;
    return -1;
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&e.addr), e.len) != 0) {
    if (errno != EINPROGRESS) {
      err = errno;
      ::close(fd);
      return -1;
    }
    if (!wait_for(fd, POLLOUT, deadline)) {
      err = ETIMEDOUT;
      ::close(fd);
      return -1;
    }
    int so = 0;
    socklen_t len = sizeof so;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &len);
    if (so != 0) {
      err = so;
      ::close(fd);
      return -1;
    }
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

}  // namespace

class Client::Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {}
  ~Conn() { ::close(fd_); }

  Reply exchange(const std::vector<uint8_t>& frame, Clock::time_point deadline) {
    size_t sent = 0;
    while (sent < frame.size()) {
      ssize_t n = ::send(fd_, frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n >= 0) {
        sent += static_cast<size_t>(n);
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_for(fd_, POLLOUT, deadline)) throw NoReply{};
      } else if (errno != EINTR) {
        throw Lost{errno_text(errno)};
      }
    }
    uint8_t header[kReplyHeader];
    receive(header, sizeof header, deadline);
    Reply r;
    r.status = static_cast<Status>(header[0]);
    const uint32_t len = get_u32(header + 1);
    if (r.status > kFailed || len > kMaxValue)
      throw Garbled{"a reply with status " + std::to_string(header[0]) + " and " + std::to_string(len) + " bytes"};
    r.payload.resize(len);
    receive(r.payload.data(), len, deadline);
    return r;
  }

 private:
  void receive(uint8_t* out, size_t len, Clock::time_point deadline) {
    size_t got = 0;
    while (got < len) {
      ssize_t n = ::recv(fd_, out + got, len - got, 0);
      if (n > 0) {
        got += static_cast<size_t>(n);
      } else if (n == 0) {
        throw Lost{describe_loss(0)};
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (!wait_for(fd_, POLLIN, deadline)) throw NoReply{};
      } else if (errno != EINTR) {
        throw Lost{describe_loss(errno)};
      }
    }
  }

  int fd_;
};

Client::Client(const std::string& host, int port, std::chrono::milliseconds timeout)
    : host_(host), port_(port), url_(url(host, port)), timeout_(std::max(timeout, std::chrono::milliseconds(0))) {
  endpoints_ = resolve(host, port);
  const auto deadline = Clock::now() + timeout_;
  int err = 0;
  auto nap = std::chrono::milliseconds(10);
  // The master's rank may not be listening yet: retry until the deadline.
  for (;;) {
    for (const Endpoint& e : endpoints_) {
      int fd = try_connect(e, deadline, err);
      if (fd < 0) continue;
      auto conn = std::make_unique<Conn>(fd);
      hello(*conn, deadline);
      idle_.push_back(std::move(conn));
      return;
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::milliseconds(250));
  }
  throw Error("cannot reach master " + url_ + " within " + std::to_string(timeout_.count()) +
              " ms: " + errno_text(err));
}

Client::~Client() = default;

void Client::hello(Conn& conn, Clock::time_point deadline) {
  std::vector<uint8_t> version;
  put_u32(version, kVersion);
  const std::string doing = "greeting it";
  try {
    Reply r = conn.exchange(request_frame(kHello, kMagic, version), deadline);
    if (r.status == kOk && r.payload.empty()) return;
    if (r.status == kFailed)
      throw Error("store " + url_ + " refused this client: " + std::string(r.payload.begin(), r.payload.end()));
    throw Garbled{"an unexpected reply"};
  } catch (const Garbled& g) {
    throw Error("store " + url_ + ": " + g.why + " to HELLO: is another program listening on the master port?");
  } catch (const Lost& l) {
    throw Error("store " + url_ + ": the connection was dropped while " + doing + " (" + l.why +
                "): is another program listening on the master port?");
  } catch (const NoReply&) {
    throw Error("store " + url_ + ": no reply to HELLO within " + std::to_string(timeout_.count()) +
                " ms: is another program listening on the master port?");
  }
}

std::unique_ptr<Client::Conn> Client::take(const std::string& doing) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      auto c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
  }
  // Once connected, a refused connection means the server is gone: say so
  // now, do not retry until the timeout.
  const auto deadline = Clock::now() + timeout_;
  int err = 0;
  for (const Endpoint& e : endpoints_) {
    int fd = try_connect(e, deadline, err);
    if (fd < 0) continue;
    auto conn = std::make_unique<Conn>(fd);
    hello(*conn, deadline);
    return conn;
  }
  throw Error("store " + url_ + ": cannot connect while " + doing + ": " + errno_text(err) +
              " (has world rank 0, which serves the store, exited?)");
}

void Client::give_back(std::unique_ptr<Conn> conn) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(std::move(conn));
}

Client::Reply Client::request(Op op, const std::string& key, const std::vector<uint8_t>& value,
                              std::chrono::milliseconds reply_within, const std::string& doing) {
  if (key.size() > kMaxKey)
    throw Error("store " + url_ + ": key of " + std::to_string(key.size()) + " bytes, over the limit of " +
                std::to_string(kMaxKey) + ", while " + doing.substr(0, 60));
  if (value.size() > kMaxValue)
    throw Error("store " + url_ + ": value of " + std::to_string(value.size()) + " bytes, over the limit of " +
                std::to_string(kMaxValue) + ", while " + doing);
  auto conn = take(doing);
  const auto frame = request_frame(op, key, value);
  try {
    Reply r = conn->exchange(frame, Clock::now() + reply_within);
    if (r.status == kFailed)
      throw Error("store " + url_ + ": refused while " + doing + ": " + std::string(r.payload.begin(), r.payload.end()));
    give_back(std::move(conn));
    return r;
  } catch (const Lost& l) {
    throw Error("store " + url_ + ": lost the connection to the server (world rank 0) while " + doing + ": " + l.why);
  } catch (const NoReply&) {
    throw Error("store " + url_ + ": no reply within " + std::to_string(reply_within.count()) + " ms while " + doing);
  } catch (const Garbled& g) {
    throw Error("store " + url_ + ": " + g.why + " while " + doing);
  }
}

void Client::set(const std::string& key, const std::vector<uint8_t>& value) {
  request(kSet, key, value, timeout_, "setting key '" + key + "'");
}

std::optional<std::vector<uint8_t>> Client::get(const std::string& key, std::chrono::milliseconds timeout) {
  timeout = std::max(timeout, std::chrono::milliseconds(0));
  std::vector<uint8_t> ms;
  put_u64(ms, static_cast<uint64_t>(timeout.count()));
  // The server answers when its own clock runs out; the grace covers the
  // trip, and only a hung server misses it.
  Reply r = request(kGet, key, ms, timeout + std::chrono::seconds(5), "waiting for key '" + key + "'");
  if (r.status == kTimedOut) return std::nullopt;
  return std::move(r.payload);
}

bool Client::check(const std::string& key) {
  Reply r = request(kCheck, key, {}, timeout_, "looking up key '" + key + "'");
  return r.payload.size() == 1 && r.payload[0] != 0;
}

}  // namespace shardplan::tcp_store
