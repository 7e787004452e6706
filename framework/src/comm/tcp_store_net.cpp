// Addresses and framing shared by the TCP store's server and client.
#include <arpa/inet.h>
#include <netdb.h>

#include <algorithm>
#include <cstring>

#include "shardplan/error.h"
#include "tcp_store.h"

namespace shardplan::tcp_store {

std::string Endpoint::numeric() const {
  char text[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET)
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, text, sizeof text);
  else if (addr.ss_family == AF_INET6)
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr, text, sizeof text);
  return text;
}

std::string url(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string errno_text(int err) {
  std::string s = std::strerror(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::vector<Endpoint> resolve(const std::string& host, int port) {
  if (port < 0 || port > 65535) throw Error("invalid port " + std::to_string(port) + " for " + url(host, 0));
  // getaddrinfo may put ::1 first for "localhost"; a server on one loopback
  // and a client trying the other would miss each other.
  const std::string name = host == "localhost" ? "127.0.0.1" : host;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  int rc = ::getaddrinfo(name.c_str(), service.c_str(), &hints, &found);
  if (rc != 0)
    throw Error("cannot resolve the master address '" + host + "' of " + url(host, port) + ": " + ::gai_strerror(rc));
  std::vector<Endpoint> out;
  for (addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_addrlen > sizeof(sockaddr_storage)) continue;
    Endpoint e;
    std::memcpy(&e.addr, a->ai_addr, a->ai_addrlen);
    e.len = a->ai_addrlen;
    bool seen = std::any_of(out.begin(), out.end(), [&](const Endpoint& o) {
      return o.len == e.len && std::memcmp(&o.addr, &e.addr, e.len) == 0;
    });
    if (!seen) out.push_back(e);
  }
  ::freeaddrinfo(found);
  if (out.empty()) throw Error("the master address '" + host + "' of " + url(host, port) + " has no TCP address");
  return out;
}

namespace {

bool is_loopback(const Endpoint& e) {
  if (e.addr.ss_family == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&e.addr)->sin_addr.s_addr) >> 24) == 127;
  if (e.addr.ss_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(&e.addr)->sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
  }
  return false;
}

bool is_numeric(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 || ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

}  // namespace

void refuse_loopback_name(const std::string& host, int port, const std::vector<Endpoint>& endpoints) {
  // A loopback number or "localhost" says "this node only" on purpose.
  if (host == "localhost" || is_numeric(host) || endpoints.empty()) return;
  if (!std::all_of(endpoints.begin(), endpoints.end(), is_loopback)) return;
  throw Error("cannot serve the rendezvous store on " + url(host, port) + ": '" + host + "' resolves to " +
              endpoints.front().numeric() +
              " (loopback) on this machine, which no other node can reach; pass the master node's "
              "interface address (hostname -I), or 127.0.0.1 for a job on one node");
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  put_u32(out, static_cast<uint32_t>(v >> 32));
  put_u32(out, static_cast<uint32_t>(v));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

uint64_t get_u64(const uint8_t* p) { return uint64_t(get_u32(p)) << 32 | get_u32(p + 4); }

std::vector<uint8_t> request_frame(Op op, const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> f;
  f.reserve(kRequestHeader + key.size() + value.size());
  f.push_back(op);
  put_u32(f, static_cast<uint32_t>(key.size()));
  put_u32(f, static_cast<uint32_t>(value.size()));
  f.insert(f.end(), key.begin(), key.end());
  f.insert(f.end(), value.begin(), value.end());
  return f;
}

void append_reply(std::vector<uint8_t>& out, Status status, const uint8_t* data, size_t len) {
  out.push_back(status);
  put_u32(out, static_cast<uint32_t>(len));
  out.insert(out.end(), data, data + len);
}

}  // namespace shardplan::tcp_store
