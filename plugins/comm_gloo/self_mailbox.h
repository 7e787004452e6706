#pragma once
// Point-to-point messages a rank sends to itself: gloo has no pair to self.
#include <gloo/common/error.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace sp_gloo {

// Messages a rank sends to itself (gloo has no pair to self). Sends are
// eager so a blocking send followed by the matching recv cannot deadlock.
class SelfMailbox {
 public:
  struct Recv {
    uint32_t tag = 0;
    void* data = nullptr;
    size_t nbytes = 0;
    bool done = false;
    std::string error;
  };

  void send(uint32_t tag, const void* data, size_t nbytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& waiting = recvs_[tag];
    if (!waiting.empty()) {
      auto r = waiting.front();
      waiting.pop_front();
      deliver(*r, data, nbytes);
    } else {
      auto p = static_cast<const uint8_t*>(data);
      sent_[tag].emplace_back(p, p + nbytes);
    }
    cv_.notify_all();
  }

  std::shared_ptr<Recv> post_recv(uint32_t tag, void* data, size_t nbytes) {
    auto r = std::make_shared<Recv>();
    r->tag = tag;
    r->data = data;
    r->nbytes = nbytes;
    std::lock_guard<std::mutex> lock(mu_);
    auto& queued = sent_[tag];
    if (!queued.empty()) {
      deliver(*r, queued.front().data(), queued.front().size());
      queued.pop_front();
    } else {
      recvs_[tag].push_back(r);
    }
    return r;
  }

  // Throws like a gloo wait would, so errors map the same way.
  void wait(Recv& r, std::chrono::milliseconds timeout, const std::atomic<bool>& aborted) {
    std::unique_lock<std::mutex> lock(mu_);
    bool finished = cv_.wait_for(lock, timeout, [&] { return r.done || aborted; });
    if (!r.done) {
      // The caller may free the buffer once we give up on it.
      auto& waiting = recvs_[r.tag];
      waiting.erase(std::remove_if(waiting.begin(), waiting.end(),
                                   [&](const std::shared_ptr<Recv>& p) { return p.get() == &r; }),
                    waiting.end());
      if (!finished)
        throw gloo::IoException("Timed out waiting " + std::to_string(timeout.count()) +
                                "ms for a message this rank sent to itself");
      throw gloo::IoException("aborted while waiting for a message this rank sent to itself");
    }
    if (!r.error.empty()) throw gloo::Exception(r.error);
  }

  void wake() { cv_.notify_all(); }

 private:
  static void deliver(Recv& r, const void* data, size_t nbytes) {
    if (nbytes != r.nbytes)
      r.error = "message to self has " + std::to_string(nbytes) + " bytes but the recv buffer " +
                std::to_string(r.nbytes);
    else if (nbytes)
      std::memcpy(r.data, data, nbytes);
    r.done = true;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint32_t, std::deque<std::vector<uint8_t>>> sent_;
  std::map<uint32_t, std::deque<std::shared_ptr<Recv>>> recvs_;
};

}  // namespace sp_gloo
