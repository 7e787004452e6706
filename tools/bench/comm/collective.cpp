#include "collective.h"

namespace shardplan_bench {

const std::vector<Collective>& all_collectives() {
  static const std::vector<Collective> all{Collective::AllReduce, Collective::AllGather, Collective::ReduceScatter,
                                           Collective::Broadcast, Collective::AllToAll,  Collective::SendRecv};
  return all;
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::AllGather: return "all_gather";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Broadcast: return "broadcast";
    case Collective::AllToAll: return "all_to_all";
    case Collective::SendRecv: return "send_recv";
  }
  return "?";
}

bool parse_collective(const std::string& name, Collective* out) {
  for (Collective c : all_collectives())
    if (name == collective_name(c)) {
      *out = c;
      return true;
    }
  return false;
}

double busbw_factor(Collective c, int n) {
  const double r = static_cast<double>(n);
  switch (c) {
    case Collective::AllReduce: return 2.0 * (r - 1) / r;
    case Collective::AllGather:
    case Collective::ReduceScatter:
    case Collective::AllToAll: return (r - 1) / r;
    case Collective::Broadcast:
    case Collective::SendRecv: return 1.0;
  }
  return 1.0;
}

bool reduces(Collective c) { return c == Collective::AllReduce || c == Collective::ReduceScatter; }
bool has_root(Collective c) { return c == Collective::Broadcast; }

Geometry geometry(Collective c, uint64_t bytes, size_t element_size, int ranks) {
  Geometry g;
  const uint64_t n = static_cast<uint64_t>(ranks);
  const uint64_t elements = element_size ? bytes / element_size : 0;
  switch (c) {
    case Collective::AllReduce:
    case Collective::Broadcast:
    case Collective::SendRecv:
      g.total = g.count = g.send = g.recv = elements;
      g.block = elements / n;
      break;
    case Collective::AllGather:
      g.block = elements / n;
      g.total = g.recv = g.block * n;
      g.count = g.send = g.block;
      break;
    case Collective::ReduceScatter:
      g.block = elements / n;
      g.total = g.send = g.block * n;
      g.count = g.recv = g.block;
      break;
    case Collective::AllToAll:
      g.block = elements / n;
      g.total = g.send = g.recv = g.block * n;
      g.count = g.block;
      break;
  }
  if (g.total == 0) g = Geometry{};
  return g;
}

}  // namespace shardplan_bench
