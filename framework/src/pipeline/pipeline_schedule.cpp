#include "shardplan/pipeline_schedule.h"

#include <algorithm>

#include "shardplan/error.h"

namespace shardplan {

namespace {

// Emits one stage's actions for forwards and backwards in a given order,
// each with the receive before it and the send after it.
struct StageWriter {
  int rank, p, v;
  std::vector<PipelineAction>& out;

  int model_stage(int chunk) const { return chunk * p + rank; }
  int last() const { return p * v - 1; }
  int rank_of(int model_stage) const { return model_stage % p; }

  void forward(int micro, int chunk) {
    const int k = model_stage(chunk);
    if (k > 0) out.push_back({PipelineOp::recv_activation, micro, chunk, rank_of(k - 1)});
    out.push_back({PipelineOp::forward, micro, chunk, -1});
    if (k < last()) out.push_back({PipelineOp::send_activation, micro, chunk, rank_of(k + 1)});
  }
  void backward(int micro, int chunk) {
    const int k = model_stage(chunk);
    if (k < last()) out.push_back({PipelineOp::recv_gradient, micro, chunk, rank_of(k + 1)});
    out.push_back({PipelineOp::backward, micro, chunk, -1});
    if (k > 0) out.push_back({PipelineOp::send_gradient, micro, chunk, rank_of(k - 1)});
  }
};

// Megatron's interleaved order: p micro-batches through chunk 0, the same
// p through chunk 1, ..., then the next p; backwards visit the chunks in
// reverse. With v = 1 this is micro-batch order.
std::pair<int, int> nth_forward(int k, int p, int v) {
  const int group = k / (p * v), in_group = k % (p * v);
  return {group * p + in_group % p, in_group / p};
}
std::pair<int, int> nth_backward(int k, int p, int v) {
  auto [micro, chunk] = nth_forward(k, p, v);
  return {micro, v - 1 - chunk};
}

std::vector<PipelineAction> one_f_one_b(int rank, int p, int m, int v) {
  std::vector<PipelineAction> out;
  StageWriter w{rank, p, v, out};
  const int total = m * v;
  // The forwards a stage runs before its first backward: enough that the
  // last stage's first backward finds every earlier stage's work in flight.
  const int warmup = std::min(total, v == 1 ? p - rank - 1 : (p - rank - 1) * 2 + (v - 1) * p);
  int f = 0, b = 0;
  for (; f < warmup; ++f) w.forward(nth_forward(f, p, v).first, nth_forward(f, p, v).second);
  for (; f < total; ++f, ++b) {
    w.forward(nth_forward(f, p, v).first, nth_forward(f, p, v).second);
    w.backward(nth_backward(b, p, v).first, nth_backward(b, p, v).second);
  }
  for (; b < total; ++b) w.backward(nth_backward(b, p, v).first, nth_backward(b, p, v).second);
  return out;
}

std::vector<PipelineAction> gpipe(int rank, int p, int m) {
  std::vector<PipelineAction> out;
  StageWriter w{rank, p, 1, out};
  for (int i = 0; i < m; ++i) w.forward(i, 0);
  for (int i = 0; i < m; ++i) w.backward(i, 0);
  return out;
}

void check_arguments(const std::string& kind, int p, int m, int v) {
  if (kind != "gpipe" && kind != "1f1b" && kind != "interleaved")
    throw Error("pipeline schedule '" + kind + "' is not one of gpipe, 1f1b, interleaved");
  if (p < 1 || m < 1 || v < 1)
    throw Error("pipeline schedule: stages, micro-batches and virtual stages must be positive, got " +
                std::to_string(p) + ", " + std::to_string(m) + ", " + std::to_string(v));
  if (kind != "interleaved" && v != 1) throw Error("pipeline schedule: virtual stages need schedule interleaved");
  if (kind == "interleaved" && (v < 2 || m % p != 0))
    throw Error("pipeline schedule interleaved: needs 2 or more virtual stages and micro-batches (" +
                std::to_string(m) + ") divisible by the stages (" + std::to_string(p) + ")");
}

}  // namespace

std::string to_string(const PipelineAction& a) {
  const std::string mb = std::to_string(a.micro) + (a.chunk ? "." + std::to_string(a.chunk) : "");
  switch (a.op) {
    case PipelineOp::forward: return "F" + mb;
    case PipelineOp::backward: return "B" + mb;
    case PipelineOp::send_activation: return "send_act " + mb + " to " + std::to_string(a.peer);
    case PipelineOp::recv_activation: return "recv_act " + mb + " from " + std::to_string(a.peer);
    case PipelineOp::send_gradient: return "send_grad " + mb + " to " + std::to_string(a.peer);
    case PipelineOp::recv_gradient: return "recv_grad " + mb + " from " + std::to_string(a.peer);
  }
  return "?";
}

PipelineSchedule pipeline_schedule(const std::string& kind, int stages, int micro_batches, int virtual_stages) {
  check_arguments(kind, stages, micro_batches, virtual_stages);
  PipelineSchedule s(stages);
  for (int r = 0; r < stages; ++r)
    s[r] = kind == "gpipe" ? gpipe(r, stages, micro_batches) : one_f_one_b(r, stages, micro_batches, virtual_stages);
  return s;
}

double pipeline_bubble(const std::string& kind, int stages, int micro_batches, int virtual_stages) {
  check_arguments(kind, stages, micro_batches, virtual_stages);
  const double p = stages, m = micro_batches, v = virtual_stages;
  return (p - 1) / (v * m + p - 1);
}

double ScheduleSimulation::bubble() const {
  double total = 0;
  for (double b : busy) total += b;
  return busy.empty() || makespan <= 0 ? 0 : 1 - total / (makespan * static_cast<double>(busy.size()));
}

}  // namespace shardplan
