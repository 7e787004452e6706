// simulate_schedule: the stages' action lists run against each other with
// the runtime's rules, in simulated time.
#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <tuple>

#include "shardplan/error.h"
#include "shardplan/pipeline_schedule.h"

namespace shardplan {

namespace {

struct Message {
  int micro, chunk;
  double time;  // when it was sent
};
// (from, to, gradient?): the runtime's channel, one tag per kind.
using Channel = std::tuple<int, int, bool>;

class Simulator {
 public:
  Simulator(const PipelineSchedule& s, double tf, double tb) : s_(s), tf_(tf), tb_(tb), at_(s.size()), clock_(s.size()) {
    result_.busy.assign(s.size(), 0);
    result_.peak_in_flight.assign(s.size(), 0);
    in_flight_.resize(s.size());
    done_.resize(s.size());
  }

  ScheduleSimulation run() {
    for (bool progress = true; progress;) {
      progress = false;
      for (size_t r = 0; r < s_.size(); ++r)
        while (at_[r] < s_[r].size() && step(static_cast<int>(r))) progress = true;
    }
    std::string blocked;
    for (size_t r = 0; r < s_.size(); ++r)
      if (at_[r] < s_[r].size())
        blocked += (blocked.empty() ? "" : ", ") + ("stage " + std::to_string(r) + " at " + to_string(s_[r][at_[r]]));
    if (!blocked.empty()) throw Error("pipeline schedule deadlocks: " + blocked);
    for (const auto& [ch, q] : queues_)
      if (!q.empty())
        throw Error("pipeline schedule: stage " + std::to_string(std::get<0>(ch)) + " sends micro-batch " +
                    std::to_string(q.front().micro) + " to stage " + std::to_string(std::get<1>(ch)) +
                    ", which never receives it");
    check_complete();
    for (double c : clock_) result_.makespan = std::max(result_.makespan, c);
    return result_;
  }

 private:
  // Runs stage r's next action; false when it must wait for a message.
  bool step(int r) {
    const PipelineAction& a = s_[r][at_[r]];
    const std::string where = "stage " + std::to_string(r) + " at " + to_string(a);
    const bool grad = a.op == PipelineOp::send_gradient || a.op == PipelineOp::recv_gradient;
    if (a.op == PipelineOp::send_activation || a.op == PipelineOp::send_gradient) {
      check_peer(a, where);
      queues_[Channel{r, a.peer, grad}].push_back({a.micro, a.chunk, clock_[r]});
    } else if (a.op == PipelineOp::recv_activation || a.op == PipelineOp::recv_gradient) {
      check_peer(a, where);
      auto& q = queues_[Channel{a.peer, r, grad}];
      if (q.empty()) return false;
      const Message m = q.front();
      q.pop_front();
      // Model stages, not chunks: the chunk changes where an interleaved
      // pipeline wraps from the last rank back to the first.
      const int p = static_cast<int>(s_.size());
      const int sent_by = m.chunk * p + a.peer, expected = a.chunk * p + r + (grad ? 1 : -1);
      if (m.micro != a.micro || sent_by != expected)
        throw Error("pipeline schedule: " + where + " receives micro-batch " + std::to_string(m.micro) +
                    " of model stage " + std::to_string(sent_by) + " (sent first on that channel)");
      clock_[r] = std::max(clock_[r], m.time);
    } else if (a.op == PipelineOp::forward) {
      if (!in_flight_[r].insert({a.micro, a.chunk}).second || done_[r].count({a.micro, a.chunk}))
        throw Error("pipeline schedule: " + where + " runs that forward twice");
      compute(r, tf_);
      result_.peak_in_flight[r] = std::max(result_.peak_in_flight[r], static_cast<int>(in_flight_[r].size()));
    } else {
      if (!in_flight_[r].erase({a.micro, a.chunk})) throw Error("pipeline schedule: " + where + " comes before its forward");
      done_[r].insert({a.micro, a.chunk});
      compute(r, tb_);
    }
    ++at_[r];
    return true;
  }

  void compute(int r, double t) {
    clock_[r] += t;
    result_.busy[r] += t;
  }

  void check_peer(const PipelineAction& a, const std::string& where) const {
    if (a.peer < 0 || a.peer >= static_cast<int>(s_.size())) throw Error("pipeline schedule: " + where + " names no stage");
  }

  // Every stage backwards every (micro-batch, chunk) it forwards, and all
  // stages the same set.
  void check_complete() const {
    for (size_t r = 0; r < s_.size(); ++r) {
      if (!in_flight_[r].empty())
        throw Error("pipeline schedule: stage " + std::to_string(r) + " never runs backward for micro-batch " +
                    std::to_string(in_flight_[r].begin()->first));
      if (done_[r] != done_[0])
        throw Error("pipeline schedule: stages 0 and " + std::to_string(r) + " run different micro-batches");
    }
  }

  const PipelineSchedule& s_;
  double tf_, tb_;
  std::vector<size_t> at_;
  std::vector<double> clock_;
  std::vector<std::set<std::pair<int, int>>> in_flight_, done_;
  std::map<Channel, std::deque<Message>> queues_;
  ScheduleSimulation result_;
};

}  // namespace

ScheduleSimulation simulate_schedule(const PipelineSchedule& schedule, double forward_time, double backward_time) {
  return Simulator(schedule, forward_time, backward_time).run();
}

}  // namespace shardplan
