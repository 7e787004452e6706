#pragma once
// Restarts of a job of several nodes, coordinated between the launchers the
// way torchelastic's agents do it: node 0's launcher serves one store for the
// whole job (the framework's TCP store, on the master address and port), and
// each start of the job is a rendezvous round whose keys carry its number.
//
//   launch/round/R/join/K   node K is ready for round R: its ranks of round
//                           R-1 are gone. Every node waits for every node's
//                           before starting ranks, so no rank of round R ever
//                           meets one of R-1.
//   launch/round/R/failed   the first failure of round R, "node K ...: cause".
//                           Every launcher watches it while its ranks run and,
//                           when another node sets it, stops its own ranks:
//                           the whole job restarts together.
//   launch/round/R/done/K   node K's ranks all exited 0 in round R; the job
//                           ends when every node's is there.
//   launch/abandon          a node ended the job (a signal, its restarts
//                           spent, a barrier that timed out): the others stop.
//   launch/left/K           node K will not use the store again; node 0
//                           waits for every node's before its store goes.
//
// The ranks of round R meet under tcp://MASTER:PORT/worker/attempt_R (no rank
// serves; torchelastic's workers use the agent's store under the same path).
// Internal to the tool.
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "launch_internal.h"

namespace shardplan::tcp_store {
class Client;
class Server;
}  // namespace shardplan::tcp_store

namespace shardplan_cli {
namespace launcher {

// A coordination step that cannot complete: the message names the nodes and
// the timeout. The job ends (no restart can help).
struct RoundsError {
  std::string message;
  int signo = 0;  // the launcher was told to stop (SIGINT, SIGTERM, SIGHUP) while waiting
};

class Rounds {
 public:
  // Node 0 starts serving; every node connects. Throws RoundsError.
  Rounds(const Options& o, std::string node);
  ~Rounds();
  Rounds(const Rounds&) = delete;
  Rounds& operator=(const Rounds&) = delete;

  // The ranks' store for round r.
  std::string rank_store(int round) const;
  // Joins round r and waits for every node. Throws RoundsError.
  void join(int round);
  // Publishes this node's failure of round r (first one wins).
  void report_failure(int round, const std::string& cause);
  // While the ranks of round r run: a thread that polls for another node's
  // failure or abandonment and then calls `news` once (from that thread).
  void watch(int round, void (*news)());
  void stop_watching();
  // What the watcher found: "node J ...: cause", and whether it ends the job.
  std::string news(bool* fatal) const;
  // After this node's ranks all exited 0: true once every node's did; false
  // when another node's failed in round r (news() says why). Throws RoundsError.
  bool finish(int round);
  // The job is over here: says why to the others (when `why` is not empty),
  // leaves, and on node 0 waits (bounded) until every node has left.
  void leave(const std::string& why);

 private:
  bool peer_news(int round);  // sets news_ when there is some
  bool barrier(int round, const std::string& what, const std::string& late);
  std::string key_round(int round, const std::string& what) const;

  const Options& opt_;
  const std::string node_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<shardplan::tcp_store::Server> server_;
  std::unique_ptr<shardplan::tcp_store::Client> client_;
  std::thread watcher_;
  std::atomic<bool> watching_{false};
  mutable std::mutex mu_;
  std::string news_;
  bool fatal_ = false;
};

}  // namespace launcher
}  // namespace shardplan_cli
