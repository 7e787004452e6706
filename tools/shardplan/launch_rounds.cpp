// Restarts coordinated between the launchers of a job (launch_rounds.h).
#include "launch_rounds.h"

#include <pthread.h>

#include <vector>

#include "shardplan/error.h"
#include "tcp_store.h"

namespace shardplan_cli {
namespace launcher {

namespace {

namespace ts = shardplan::tcp_store;
constexpr milliseconds kBarrierPoll{100};
constexpr milliseconds kWatchPoll{200};
// How long node 0 keeps its store for nodes that have not said they left:
// one that is stopping its ranks needs the launcher's grace and kill wait.
constexpr milliseconds kLeaveWait = kGrace + kKillWait + milliseconds(5000);

std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

// Threads of ours must not take the launcher's signals (its handlers write
// to the event loop's pipe from whichever thread runs them; fine, but a
// blocking poll in a thread of ours would be cut short for nothing).
template <class F>
std::thread quiet_thread(F&& f) {
  sigset_t all, previous;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &previous);
  std::thread t(std::forward<F>(f));
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return t;
}

// Between two starts no event loop reads our signals (JobSignals remembers
// them); a barrier that waits for the other nodes must still end on one,
// and tell them (leave()).
void check_signal() {
  if (int signo = pending_signal())
    throw RoundsError{"received " + signal_name(signo) + " while waiting for the other nodes", signo};
}

}  // namespace

Rounds::Rounds(const Options& o, std::string node)
    : opt_(o), node_(std::move(node)), timeout_(o.has_timeout ? o.timeout_ms : 300000) {
  try {
    if (o.node_rank == 0) {
      // The server's thread is started with our signals blocked, as above.
      sigset_t all, previous;
      sigfillset(&all);
      pthread_sigmask(SIG_BLOCK, &all, &previous);
      try {
        server_ = ts::Server::start(o.master_addr, o.master_port);
      } catch (...) {
        pthread_sigmask(SIG_SETMASK, &previous, nullptr);
        throw;
      }
      pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    }
    client_ = std::make_unique<ts::Client>(o.master_addr, o.master_port, timeout_);
  } catch (const shardplan::Error& e) {
    throw RoundsError{std::string("the job's restarts need the launchers' store: ") + e.what()};
  }
}

Rounds::~Rounds() {
  stop_watching();
  client_.reset();
  if (server_) ts::Server::release(std::move(server_));
}

std::string Rounds::rank_store(int round) const {
  return ts::url(opt_.master_addr, opt_.master_port) + "/worker/attempt_" + std::to_string(round);
}

std::string Rounds::key_round(int round, const std::string& what) const {
  return "launch/round/" + std::to_string(round) + "/" + what;
}

// Every node's key `what` of round r (or `abandon`), polled until `deadline`:
// the nodes that have not set it, empty once all have.
namespace {
std::vector<int> missing(ts::Client& c, int nnodes, const std::string& prefix, std::vector<bool>& seen) {
  std::vector<int> out;
  for (int k = 0; k < nnodes; ++k) {
    if (!seen[static_cast<size_t>(k)]) seen[static_cast<size_t>(k)] = c.check(prefix + std::to_string(k));
    if (!seen[static_cast<size_t>(k)]) out.push_back(k);
  }
  return out;
}

std::string list(const std::vector<int>& nodes) {
  std::string s;
  for (int k : nodes) s += (s.empty() ? "" : ", ") + std::to_string(k);
  return (nodes.size() == 1 ? "node " : "nodes ") + s;
}
}  // namespace

// Sets this node's key `what`K of round r, then waits for every node's:
// true once all are there, false when another node's news came first
// (news() says it). Throws RoundsError after the timeout, naming the nodes
// that are `late`, and on a signal.
bool Rounds::barrier(int round, const std::string& what, const std::string& late) {
  client_->set(key_round(round, what + std::to_string(opt_.node_rank)), bytes("1"));
  std::vector<bool> seen(static_cast<size_t>(opt_.nnodes), false);
  const auto deadline = Clock::now() + timeout_;
  for (;;) {
    check_signal();
    const std::vector<int> absent = missing(*client_, opt_.nnodes, key_round(round, what), seen);
    if (absent.empty()) return true;
    if (peer_news(round)) return false;
    if (Clock::now() >= deadline)
      throw RoundsError{list(absent) + " " + late + " within " + std::to_string(timeout_.count()) + " ms"};
    std::this_thread::sleep_for(kBarrierPoll);
  }
}

void Rounds::join(int round) {
  const std::string r = std::to_string(round);
  try {
    if (!barrier(round, "join/", "did not join rendezvous round " + r)) throw RoundsError{news(nullptr)};
  } catch (const shardplan::Error& e) {
    throw RoundsError{std::string("lost the launchers' store while joining round ") + r + ": " + e.what()};
  }
}

void Rounds::report_failure(int round, const std::string& cause) {
  try {
    if (!client_->check(key_round(round, "failed"))) client_->set(key_round(round, "failed"), bytes(node_ + ": " + cause));
  } catch (const shardplan::Error&) {
    // The others learn it from their own ranks, which lose this node's.
  }
}

// Another node's failure of `round`, or the job abandoned: news_ says which.
bool Rounds::peer_news(int round) {
  std::string msg;
  bool fatal = false;
  // A failure first: a node that gives up after its last restart abandons
  // the job right after publishing the failure, and the others must see the
  // failure to give up alike, with its cause.
  if (client_->check(key_round(round, "failed"))) {
    std::vector<uint8_t> v = *client_->get(key_round(round, "failed"), timeout_);
    msg = std::string(v.begin(), v.end());
  } else if (client_->check("launch/abandon")) {
    std::vector<uint8_t> v = *client_->get("launch/abandon", timeout_);
    msg = std::string(v.begin(), v.end());
    fatal = true;
  } else {
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  news_ = msg;
  fatal_ = fatal;
  return true;
}

void Rounds::watch(int round, void (*news)()) {
  stop_watching();
  watching_ = true;
  watcher_ = quiet_thread([this, round, news] {
    while (watching_) {
      try {
        if (peer_news(round)) return news();
      } catch (const shardplan::Error& e) {
        std::lock_guard<std::mutex> lock(mu_);
        news_ = std::string("lost the launchers' store: ") + e.what();
        fatal_ = true;
        return news();
      }
      for (auto t = milliseconds(0); watching_ && t < kWatchPoll; t += milliseconds(20))
        std::this_thread::sleep_for(milliseconds(20));
    }
  });
}

void Rounds::stop_watching() {
  watching_ = false;
  if (watcher_.joinable()) watcher_.join();
}

std::string Rounds::news(bool* fatal) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (fatal) *fatal = fatal_;
  return news_;
}

bool Rounds::finish(int round) {
  const std::string r = std::to_string(round);
  try {
    if (barrier(round, "done/", "did not finish round " + r)) return true;
  } catch (const shardplan::Error& e) {
    throw RoundsError{std::string("lost the launchers' store after round ") + r + ": " + e.what()};
  }
  bool fatal = false;
  const std::string why = news(&fatal);
  if (fatal) throw RoundsError{why};
  return false;
}

void Rounds::leave(const std::string& why) {
  stop_watching();
  try {
    if (!why.empty() && !client_->check("launch/abandon")) client_->set("launch/abandon", bytes(node_ + ": ended the job: " + why));
    client_->set("launch/left/" + std::to_string(opt_.node_rank), bytes("1"));
    if (!server_) return;
    std::vector<bool> seen(static_cast<size_t>(opt_.nnodes), false);
    const auto deadline = Clock::now() + std::min(timeout_, kLeaveWait);
    while (!missing(*client_, opt_.nnodes, "launch/left/", seen).empty() && Clock::now() < deadline)
      std::this_thread::sleep_for(kBarrierPoll);
  } catch (const shardplan::Error&) {
    // Leaving: nothing left to coordinate with.
  }
}

}  // namespace launcher
}  // namespace shardplan_cli
