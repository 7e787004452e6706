#pragma once
// A gloo context this plugin can abort: every pending operation on it fails
// at once, as gloo itself does when one times out.
#include <gloo/rendezvous/context.h>
#if SHARDPLAN_GLOO_TCP_HEADERS
#include <gloo/transport/tcp/context.h>
#endif

#include <string>

namespace sp_gloo {

// tcp::Context::signalException is what gloo itself calls when an operation
// times out: it fails every pending buffer and closes every pair. Aborting a
// communicator is exactly that, on demand.
#if SHARDPLAN_GLOO_TCP_HEADERS
// It is protected; naming it through a derived class yields a usable pointer.
struct TcpContextAccess : gloo::transport::tcp::Context {
  static auto signal() { return &TcpContextAccess::signalException; }
};
inline void fail_pending(gloo::transport::Context* ctx, const std::string& why) {
  (static_cast<gloo::transport::tcp::Context*>(ctx)->*TcpContextAccess::signal())(why);
}
#else
// Some packages (Debian's libgloo-dev 0.5.0) ship tcp/context.h without the
// gloo/common/memory.h it includes, so the class cannot be named. The member
// is exported and non-virtual; on the Itanium C++ ABI a member function takes
// `this` as its first argument, and transport::Context is tcp::Context's
// primary base, so the transport context's address is `this`.
void gloo_tcp_context_signal_exception(void* self, const std::string& why) __asm__(
    "_ZN4gloo9transport3tcp7Context15signalExceptionERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
inline void fail_pending(gloo::transport::Context* ctx, const std::string& why) {
  gloo_tcp_context_signal_exception(ctx, why);
}
#endif

class Context final : public gloo::rendezvous::Context {
 public:
  using gloo::rendezvous::Context::Context;

  void abort(const std::string& why) {
    // Every context of this plugin comes from a TCP device.
    if (transportContext_) fail_pending(transportContext_.get(), why);
  }
};

}  // namespace sp_gloo
