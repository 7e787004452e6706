// TensorParallel's rank threads: every job runs on all ranks at once, a
// failure on one aborts the others' collectives and leaves the wrapper
// broken, and replicated copies follow their holder before each job.
#include <ATen/ATen.h>

#include <exception>
#include <mutex>
#include <string>

#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "tensor_parallel_internal.h"

namespace shardplan {

namespace tp_detail {

Workers::Workers(int n) : n_(n) {
  for (int r = 0; r < n; ++r) threads_.emplace_back([this, r] { loop(r); });
}

Workers::~Workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void Workers::run(const std::function<void(int)>& job, const std::function<void()>& on_failure) {
  std::unique_lock<std::mutex> lock(mu_);
  job_ = job;
  on_failure_ = on_failure;
  pending_ = n_;
  first_error_ = nullptr;
  failed_rank_ = -1;
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (!first_error_) return;
  try {
    std::rethrow_exception(first_error_);
  } catch (const c10::Error& e) {
    throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": " + e.what());
  } catch (...) {
    throw Error("TensorParallel: rank " + std::to_string(failed_rank_) + ": unknown exception");
  }
}

void Workers::loop(int r) {
  uint64_t seen = 0;
  for (;;) {
    std::function<void(int)> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error;
    try {
      job(r);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (error && !first_error_) {
      first_error_ = error;
      failed_rank_ = r;
      if (on_failure_) on_failure_();
    }
    if (--pending_ == 0) done_.notify_all();
  }
}

}  // namespace tp_detail

void TensorParallelImpl::Runtime::abort_all() {
  std::lock_guard<std::mutex> lock(worlds_mu);
  for (auto& w : worlds)
    if (w) w->comm().abort();  // groups split from the world inherit the abort
}

void TensorParallelImpl::Runtime::run(const std::function<void(int)>& job) {
  if (!broken.empty())
    throw Error("TensorParallel: unusable after an earlier failure (" + broken +
                "); its collectives are incomplete, so build a new TensorParallel");
  try {
    workers->run(job, [this] { abort_all(); });
  } catch (const Error& e) {
    broken = e.what();
    throw;
  }
}

// Non-holders take their holder's values before the ranks compute with
// them. Always: optimizers update through .data(), which no version
// counter sees. Through variable_data(), so the copy bumps no version
// either and a graph still waiting for its backward stays valid (the
// values only change where an optimizer step changed the holder's).
void TensorParallelImpl::Runtime::sync_replicated(int r) {
  at::NoGradGuard no_grad;
  for (auto& p : params) {
    const int h = p.holder[r];
    if (h == r) continue;
    p.tensor[r].variable_data().copy_(p.tensor[h]);
    // Its gradient equals the holder's and is never read; dropping it keeps
    // it from growing across steps nobody zeroes.
    p.tensor[r].mutable_grad().reset();
  }
}

}  // namespace shardplan
