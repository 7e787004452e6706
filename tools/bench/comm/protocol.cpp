#include "protocol.h"

#include <unistd.h>

#include <cstdio>
#include <sstream>

namespace shardplan_bench {

namespace {
const char* const kPrefix = "@@spbench ";

std::string mode(const ModeResult& m) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%d %.9g %.9g %.9g %lld", m.measured ? 1 : 0, m.mean_s, m.p50_s, m.p99_s,
                static_cast<long long>(m.wrong));
  return buf;
}

bool read_mode(std::istream& in, ModeResult* m) {
  int measured = 0;
  long long wrong = -1;
  if (!(in >> measured >> m->mean_s >> m->p50_s >> m->p99_s >> wrong)) return false;
  m->measured = measured != 0;
  m->wrong = wrong;
  return true;
}
}  // namespace

std::string encode_at(Collective c, uint64_t bytes) {
  return std::string(kPrefix) + "at " + collective_name(c) + " " + std::to_string(bytes) + "\n";
}

std::string encode_row(const RankRow& r) {
  return std::string(kPrefix) + "row " + std::to_string(r.rank) + " " + collective_name(r.coll) + " " +
         std::to_string(r.bytes) + " " + std::to_string(r.count) + " " + mode(r.out) + " " + mode(r.in) + "\n";
}

static std::string one_line(std::string t) {
  for (char& ch : t)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return t;
}

std::string encode_note(const std::string& text) { return std::string(kPrefix) + "note " + one_line(text) + "\n"; }

std::string encode_error(int rank, const std::string& text) {
  return std::string(kPrefix) + "error " + std::to_string(rank) + " " + one_line(text) + "\n";
}

std::string encode_done(int rank) { return std::string(kPrefix) + "done " + std::to_string(rank) + "\n"; }

Message decode(const std::string& line) {
  Message m;
  const size_t at = line.find(kPrefix);
  if (at == std::string::npos) return m;
  std::istringstream in(line.substr(at + std::string(kPrefix).size()));
  std::string kind, coll;
  in >> kind;
  if (kind == "at") {
    if (in >> coll >> m.bytes && parse_collective(coll, &m.coll)) m.kind = Message::At;
  } else if (kind == "row") {
    RankRow& r = m.row;
    if (in >> r.rank >> coll >> r.bytes >> r.count && parse_collective(coll, &r.coll) && read_mode(in, &r.out) &&
        read_mode(in, &r.in))
      m.kind = Message::Row;
  } else if (kind == "note") {
    std::getline(in >> std::ws, m.text);
    m.kind = Message::Note;
  } else if (kind == "done") {
    if (in >> m.rank) m.kind = Message::Done;
  } else if (kind == "error") {
    if (in >> m.rank) {
      std::getline(in >> std::ws, m.text);
      m.kind = Message::Error;
    }
  }
  return m;
}

void emit(const std::string& line) {
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(STDOUT_FILENO, p, left);
    if (n <= 0) return;  // the coordinator is gone; it will not read more anyway
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace shardplan_bench
