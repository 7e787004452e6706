#pragma once
// How gloo's failures reach the caller: as a status and a one-line message,
// never as SIGPIPE or an exception crossing the C ABI.
#include <gloo/common/error.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <ctime>
#include <string>

#include "rendezvous.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"

namespace sp_gloo {

using shardplan::comm::fail;

// gloo writes to its sockets with writev(), so a peer that died raises
// SIGPIPE in whichever thread writes next, and the default action kills the
// whole process before gloo can report the error. SIGPIPE is thread-directed:
// blocking it around our calls (and in threads we start; gloo's event loop
// inherits the mask when the device is created inside such a call) turns it
// into EPIPE without changing how the host process treats its own pipes.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeBlock() {
    // Where SIGPIPE was not blocked before, one pending now was raised by
    // our writes (an earlier one would have been delivered); consume it
    // before unblocking. Where it was blocked, the host handles it.
    if (!sigismember(&old_, SIGPIPE)) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        timespec zero{};
        sigtimedwait(&pipe_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
};

// gloo prefixes messages with "[file:line] ", sometimes twice; users want

// the cause on one line.
inline std::string clean(std::string msg) {
  while (msg.size() > 1 && msg[0] == '[') {
    auto close = msg.find("] ");
    if (close == std::string::npos) break;
    msg.erase(0, close + 2);
  }
  std::replace(msg.begin(), msg.end(), '\n', ' ');
  return msg;
}

inline bool mentions_timeout(const std::string& msg) {
  std::string low(msg);
  std::transform(low.begin(), low.end(), low.begin(), [](unsigned char c) { return std::tolower(c); });
  return low.find("timed out") != std::string::npos || low.find("timeout") != std::string::npos;
}

// Runs fn() with SIGPIPE blocked; any exception becomes a status whose
// message names `op`.
template <typename Fn>
int guarded(const char* op, Fn&& fn) {
  SigpipeBlock no_sigpipe;
  try {
    return fn();
  } catch (const RendezvousError& e) {
    return fail(e.status(), std::string("gloo ") + op + ": " + clean(e.what()));
  } catch (const gloo::IoException& e) {
    std::string m = clean(e.what());
    return fail(mentions_timeout(m) ? SP_ERR_TIMEOUT : SP_ERR_INTERNAL, std::string("gloo ") + op + ": " + m);
  } catch (const std::exception& e) {
    return fail(SP_ERR_INTERNAL, std::string("gloo ") + op + ": " + clean(e.what()));
  } catch (...) {
    return fail(SP_ERR_INTERNAL, std::string("gloo ") + op + ": unknown error");
  }
}

}  // namespace sp_gloo
