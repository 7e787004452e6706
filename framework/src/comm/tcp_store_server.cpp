// The TCP store's server: one thread polling the listening sockets and every
// connection (no connection can hold up another: a peer that connects and
// says nothing, or stops halfway through a frame, is closed after a window),
// and a process-wide registry that joins servers outliving their owner.
#include <fcntl.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>

#include "shardplan/error.h"
#include "tcp_store.h"

namespace shardplan::tcp_store {

namespace {

using Clock = std::chrono::steady_clock;

struct Conn {
  explicit Conn(int f) : fd(f) {}
  ~Conn() { ::close(fd); }
  int fd;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  size_t out_off = 0;
  bool hello = false;
  bool closing = false;  // close once `out` is sent (after an ERROR reply)
  bool dead = false;     // closed at the end of this round
  std::optional<std::string> waiting_key;  // a GET waiting for its key
  Clock::time_point wait_until;
  // A stalled connection is given up: no HELLO within its window, half a
  // frame for a whole window, or a reply the peer does not read.
  Clock::time_point accepted_at = Clock::now();
  std::optional<Clock::time_point> partial_since;
  std::optional<Clock::time_point> blocked_since;

  bool busy() const { return closing || dead || waiting_key || out_off < out.size(); }
  std::optional<Clock::time_point> stall_deadline() const {
    std::optional<Clock::time_point> d;
    auto earliest = [&](Clock::time_point t) { d = d ? std::min(*d, t) : t; };
    if (!hello) earliest(accepted_at + kHelloWindow);
    if (partial_since) earliest(*partial_since + kFrameWindow);
    if (blocked_since) earliest(*blocked_since + kFrameWindow);
    return d;
  }
};

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

struct Server::State {
  std::vector<int> listeners;
  int wake_fd = -1;
  std::thread thread;

  std::mutex mu;
  std::condition_variable cv;
  bool stop_requested = false;
  bool released = false;
  bool lingering = false;  // released with peers still connected
  bool finished = false;
  std::mutex join_mu;
  bool joined = false;

  // Owned by the thread.
  std::map<std::string, std::vector<uint8_t>> data;
  uint64_t bytes = 0;
  std::vector<std::unique_ptr<Conn>> conns;
  Clock::time_point accept_paused_until{};

  void run();
  void accept_all(int listener);
  bool read_from(Conn& c);  // false: the peer has gone
  void serve(Conn& c);
  void handle(Conn& c, Op op, std::string key, const uint8_t* value, uint32_t value_len);
  void reply(Conn& c, Status s, const uint8_t* data, size_t len);
  void refuse(Conn& c, const std::string& why);
  bool flush(Conn& c);  // false: the peer has gone
  void wake() {
    uint64_t one = 1;
    ssize_t n = ::write(wake_fd, &one, sizeof one);
    (void)n;
  }
};

// ------------------------------------------------------------- registry

// Servers released while peers were still connected, joined once they end
// or at exit. Never destroyed: a store released during static destruction
// must still find it.
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Server>> lingering;
  std::vector<std::weak_ptr<Server>> all;
  pid_t pid = ::getpid();

  static Registry& get() {
    static Registry* r = [] {
      auto* reg = new Registry;
      std::atexit(&Registry::at_exit);
      return reg;
    }();
    return *r;
  }

  // Every server still running stops before the process's statics go:
  // no thread outlives exit() touching memory being torn down.
  static void at_exit() {
    Registry& r = get();
    // A child forked from a process with servers has their state but not
    // their threads; joining would wait forever.
    if (::getpid() != r.pid) return;
    std::vector<std::shared_ptr<Server>> servers;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      servers.swap(r.lingering);
      for (auto& w : r.all)
        if (auto s = w.lock()) servers.push_back(std::move(s));
      r.all.clear();
    }
    for (auto& s : servers) s->stop();
  }

  void add(const std::shared_ptr<Server>& s) {
    std::lock_guard<std::mutex> lock(mu);
    all.erase(std::remove_if(all.begin(), all.end(), [](const std::weak_ptr<Server>& w) { return w.expired(); }),
              all.end());
    all.push_back(s);
  }
};

// ---------------------------------------------------------------- start

std::shared_ptr<Server> Server::start(const std::string& host, int port) {
  const std::vector<Endpoint> endpoints = resolve(host, port);
  refuse_loopback_name(host, port, endpoints);
  const std::string where = "cannot serve the rendezvous store on " + url(host, port) + ": ";
  std::shared_ptr<Server> server(new Server);
  server->state_ = std::make_unique<State>();
  State& st = *server->state_;
  auto close_all = [&] {
    for (int fd : st.listeners) ::close(fd);
    st.listeners.clear();
  };
  std::string not_local;
  int bound_port = port;
  for (Endpoint e : endpoints) {
    if (bound_port != port) {  // port 0: every address gets the kernel's first pick
      if (e.addr.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&e.addr)->sin_port = htons(bound_port);
      else reinterpret_cast<sockaddr_in6*>(&e.addr)->sin6_port = htons(bound_port);
    }
    int fd = ::socket(e.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      int err = errno;
      close_all();
      throw Error(where + errno_text(err));
    }
    int one = 1;
    // A restarted job may reuse the port while the last one's connections
    // linger in TIME_WAIT; a live listener still makes bind fail.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    // Exactly the address asked for: "::" does not take IPv4 too.
    if (e.addr.ss_family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&e.addr), e.len) != 0) {
      int err = errno;
      ::close(fd);
      if (err == EADDRNOTAVAIL) {
        not_local += (not_local.empty() ? "" : ", ") + e.numeric();
        continue;
      }
      close_all();
      if (err == EADDRINUSE) throw Error("port " + std::to_string(port) + " already in use on " + host);
      throw Error(where + "bind to " + e.numeric() + ": " + errno_text(err));
    }
    if (::listen(fd, SOMAXCONN) != 0) {
      int err = errno;
      ::close(fd);
      close_all();
      throw Error(where + "listen: " + errno_text(err));
    }
    if (bound_port == 0) {
      sockaddr_storage a{};
      socklen_t len = sizeof a;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
      bound_port = ntohs(a.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&a)->sin_port
                                                : reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
    }
    st.listeners.push_back(fd);
  }
  if (st.listeners.empty())
    throw Error(where + (not_local.find(',') == std::string::npos ? not_local + " is" : not_local + " are") +
                " not an address of this machine (the master address must be one of the master node's own; "
                "0.0.0.0 listens on every interface)");
  st.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (st.wake_fd < 0) {
    int err = errno;
    close_all();
    throw Error(where + "eventfd: " + errno_text(err));
  }
  server->port_ = bound_port;
  Registry::get().add(server);
  st.thread = std::thread([&st] { st.run(); });
  return server;
}

Server::~Server() {
  stop();
  if (state_ && state_->wake_fd >= 0) ::close(state_->wake_fd);
}

void Server::stop() {
  State& st = *state_;
  std::lock_guard<std::mutex> join_lock(st.join_mu);
  if (st.joined || !st.thread.joinable()) return;  // stopped, or start() failed before the thread
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.stop_requested = true;
  }
  st.wake();
  st.thread.join();
  st.joined = true;
}

void Server::release(std::shared_ptr<Server> server) {
  if (!server) return;
  State& st = *server->state_;
  bool finished;
  {
    std::unique_lock<std::mutex> lock(st.mu);
    st.released = true;
    st.wake();
    st.cv.wait(lock, [&] { return st.finished || st.lingering; });
    finished = st.finished;
  }
  if (finished) return server->stop();
  // No server's mutex is held while taking the registry's: two releases at
  // once would take them in opposite orders.
  Registry& r = Registry::get();
  std::lock_guard<std::mutex> reg_lock(r.mu);
  // Reap those that have ended since.
  for (auto& s : r.lingering) {
    bool ended;
    {
      std::lock_guard<std::mutex> l(s->state_->mu);
      ended = s->state_->finished;
    }
    if (ended) s.reset();  // joins; its mutex goes with it, so not under the lock
  }
  r.lingering.erase(std::remove(r.lingering.begin(), r.lingering.end(), nullptr), r.lingering.end());
  r.lingering.push_back(std::move(server));
}

// ----------------------------------------------------------------- loop

void Server::State::run() {
  std::vector<pollfd> fds;
  for (;;) {
    const auto now = Clock::now();
    fds.clear();
    fds.push_back({wake_fd, POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    for (int l : listeners) fds.push_back({l, static_cast<short>(accepting ? POLLIN : 0), 0});
    auto next = now + std::chrono::hours(24);
    if (!accepting) next = std::min(next, accept_paused_until);
    for (auto& c : conns) {
      // A busy connection is not read (at most one request in flight, and
      // no unbounded reply queue for a peer that never reads); its hang-up
      // still shows as POLLRDHUP.
      short ev = POLLRDHUP;
      if (!c->busy()) ev |= POLLIN;
      if (c->out_off < c->out.size()) ev |= POLLOUT;
      fds.push_back({c->fd, ev, 0});
      if (auto d = c->stall_deadline()) next = std::min(next, *d);
      if (c->waiting_key) next = std::min(next, c->wait_until);
    }
    auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1;
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait_ms, 0, 1 << 30)));
    if (rc < 0 && errno != EINTR) break;  // cannot happen with valid fds; never spin

    if (fds[0].revents) {
      uint64_t n;
      while (::read(wake_fd, &n, sizeof n) > 0) {
      }
    }
    for (size_t i = 0; i < listeners.size(); ++i)
      if (fds[1 + i].revents & POLLIN) accept_all(listeners[i]);
    // conns may grow in accept_all; only the ones polled have revents.
    const size_t polled = fds.size() - 1 - listeners.size();
    for (size_t i = 0; i < polled; ++i) {
      Conn& c = *conns[i];
      short re = fds[1 + listeners.size() + i].revents;
      if ((re & POLLOUT) && !flush(c)) c.dead = true;
      if (!c.dead && (re & POLLIN) && !read_from(c)) c.dead = true;
      // A peer that hung up is gone (after what it sent before), a GET it
      // waited on with it.
      if (re & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) c.dead = true;
    }
    // Time: GETs that ran out, stalled peers.
    const auto t = Clock::now();
    for (auto& c : conns) {
      if (c->waiting_key && t >= c->wait_until) {
        c->waiting_key.reset();
        reply(*c, kTimedOut, nullptr, 0);
      }
    }
    conns.erase(std::remove_if(conns.begin(), conns.end(),
                               [&](const std::unique_ptr<Conn>& c) {
                                 auto d = c->stall_deadline();
                                 return c->dead || (d && t >= *d);
                               }),
                conns.end());

    std::lock_guard<std::mutex> lock(mu);
    if (stop_requested || (released && conns.empty())) break;
    if (released && !lingering) {
      lingering = true;
      cv.notify_all();
    }
  }
  for (int fd : listeners) ::close(fd);
  listeners.clear();
  conns.clear();
  std::lock_guard<std::mutex> lock(mu);
  finished = true;
  cv.notify_all();
}

void Server::State::accept_all(int listener) {
  for (;;) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
        accept_paused_until = Clock::now() + std::chrono::milliseconds(100);  // else poll spins on it
      return;
    }
    if (conns.size() >= kMaxConnections) {
      ::close(fd);
      continue;
    }
    set_nodelay(fd);
    conns.push_back(std::make_unique<Conn>(fd));
  }
}

bool Server::State::read_from(Conn& c) {
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n == 0) return false;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
    c.in.insert(c.in.end(), buf, buf + n);
    serve(c);
    if (c.busy()) return true;  // the rest waits in the socket
  }
}

// Takes every whole request out of `in`, one at a time while the
// connection is free to answer.
void Server::State::serve(Conn& c) {
  size_t off = 0;
  while (!c.busy() && c.in.size() - off >= kRequestHeader) {
    const uint8_t* h = c.in.data() + off;
    const uint8_t op = h[0];
    const uint32_t key_len = get_u32(h + 1), value_len = get_u32(h + 5);
    if (op < kHello || op > kCheck) {
      refuse(c, "unknown request type " + std::to_string(op) + " (not a shardplan store client?)");
      break;
    }
    if (!c.hello && op != kHello) {
      refuse(c, "the first request must be HELLO");
      break;
    }
    if (key_len > kMaxKey) {
      refuse(c, "key of " + std::to_string(key_len) + " bytes, over the limit of " + std::to_string(kMaxKey));
      break;
    }
    if (value_len > kMaxValue) {
      refuse(c, "value of " + std::to_string(value_len) + " bytes, over the limit of " + std::to_string(kMaxValue));
      break;
    }
    const uint32_t fixed = op == kHello ? 4 : op == kGet ? 8 : op == kCheck ? 0 : value_len;
    if (value_len != fixed) {
      refuse(c, "request type " + std::to_string(op) + " with a value of " + std::to_string(value_len) + " bytes");
      break;
    }
    const size_t need = kRequestHeader + key_len + value_len;
    if (c.in.size() - off < need) break;
    std::string key(reinterpret_cast<const char*>(h + kRequestHeader), key_len);
    handle(c, static_cast<Op>(op), std::move(key), h + kRequestHeader + key_len, value_len);
    off += need;
  }
  c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(std::min(off, c.in.size())));
  if (c.closing) c.in.clear();
  // A frame begun must end within the window; a peer done talking has none.
  if (c.in.empty()) c.partial_since.reset();
  else if (!c.partial_since) c.partial_since = Clock::now();
}

void Server::State::handle(Conn& c, Op op, std::string key, const uint8_t* value, uint32_t value_len) {
  switch (op) {
    case kHello: {
      if (key != kMagic) return refuse(c, "not a shardplan store client");
      uint32_t v = get_u32(value);
      if (v != kVersion)
        return refuse(c, "store protocol version " + std::to_string(v) + ", this server speaks " +
                             std::to_string(kVersion) + " (mixed shardplan versions?)");
      c.hello = true;
      return reply(c, kOk, nullptr, 0);
    }
    case kSet: {
      auto it = data.find(key);
      uint64_t after = bytes + value_len + (it == data.end() ? key.size() : 0) - (it == data.end() ? 0 : it->second.size());
      if (after > kMaxStoreBytes) {
        std::string why = "the store holds " + std::to_string(bytes) + " bytes; key '" + key + "' would exceed " +
                          std::to_string(kMaxStoreBytes);
        return reply(c, kFailed, reinterpret_cast<const uint8_t*>(why.data()), why.size());
      }
      bytes = after;
      auto& slot = data[key];
      slot.assign(value, value + value_len);
      reply(c, kOk, nullptr, 0);
      for (auto& other : conns)
        if (other->waiting_key && *other->waiting_key == key) {
          other->waiting_key.reset();
          reply(*other, kOk, slot.data(), slot.size());
        }
      return;
    }
    case kGet: {
      auto it = data.find(key);
      if (it != data.end()) return reply(c, kOk, it->second.data(), it->second.size());
      uint64_t ms = std::min<uint64_t>(get_u64(value), uint64_t(365) * 24 * 3600 * 1000);
      if (ms == 0) return reply(c, kTimedOut, nullptr, 0);
      c.waiting_key = std::move(key);
      c.wait_until = Clock::now() + std::chrono::milliseconds(ms);
      return;
    }
    case kCheck: {
      uint8_t found = data.count(key) ? 1 : 0;
      return reply(c, kOk, &found, 1);
    }
  }
}

void Server::State::reply(Conn& c, Status s, const uint8_t* payload, size_t len) {
  if (c.out_off >= c.out.size()) {
    c.out.clear();
    c.out_off = 0;
  }
  append_reply(c.out, s, payload, len);
  if (!flush(c)) c.dead = true;
}

void Server::State::refuse(Conn& c, const std::string& why) {
  c.closing = true;
  c.waiting_key.reset();
  reply(c, kFailed, reinterpret_cast<const uint8_t*>(why.data()), why.size());
}

bool Server::State::flush(Conn& c) {
  while (c.out_off < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        // A reader making no progress for a whole window is dropped.
        if (!c.blocked_since) c.blocked_since = Clock::now();
        return true;
      }
      return false;
    }
    c.out_off += static_cast<size_t>(n);
    c.blocked_since.reset();
  }
  c.out.clear();
  c.out_off = 0;
  if (c.closing) c.dead = true;  // said what it had to
  return true;
}

}  // namespace shardplan::tcp_store
