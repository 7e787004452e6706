#pragma once
// What workers tell the coordinator, one line each on stdout, so the same
// pipe works for threads, fork/exec'd ranks and ranks under mpirun (which
// forwards every rank's stdout). Lines without the prefix are ignored:
// libraries may print too.
//
//   @@spbench at <collective> <bytes>            rank 0 starts a size
//   @@spbench row <rank> <collective> <bytes> <count> <out> <in>
//       where <out> and <in> are: <measured 0|1> <mean s> <p50 s> <p99 s> <wrong, -1 unchecked>
//   @@spbench note <free text>                   shown under the series' table
//   @@spbench done <rank>                        the rank finished its sweep
//   @@spbench error <rank> <free text>           why the rank is giving up
#include <cstdint>
#include <string>

#include "collective.h"

namespace shardplan_bench {

struct ModeResult {
  bool measured = false;
  double mean_s = 0, p50_s = 0, p99_s = 0;
  int64_t wrong = -1;  // -1: not checked
};

struct RankRow {
  int rank = 0;
  Collective coll = Collective::AllReduce;
  uint64_t bytes = 0, count = 0;
  ModeResult out, in;
};

struct Message {
  enum Kind { None, At, Row, Note, Done, Error } kind = None;
  Collective coll = Collective::AllReduce;
  uint64_t bytes = 0;
  RankRow row;
  std::string text;
  int rank = 0;
};

std::string encode_at(Collective c, uint64_t bytes);
std::string encode_row(const RankRow& r);
std::string encode_note(const std::string& text);
std::string encode_done(int rank);
std::string encode_error(int rank, const std::string& text);
// Kind None for anything that is not a well-formed protocol line.
Message decode(const std::string& line);

// Writes one protocol line to stdout with a single write(), so lines of
// ranks that share the pipe do not interleave.
void emit(const std::string& line);

}  // namespace shardplan_bench
