// The ranks' output: read from their pipes, whole lines prefixed "[rank K] ",
// and mpirun's "[job,rank]<stdout>:" tags rewritten into that prefix.
#include "launch_internal.h"

namespace shardplan_cli {
namespace launcher {

// ------------------------------------------------------- mpirun's tags

enum class TagMatch { kNo, kPartial, kFull };

// Whether `s` at `pos` starts with mpirun's tag "[JOB,RANK]<stdout>:" (or
// <stderr>:, <stddiag>:); kPartial when `s` ends inside what could still
// become one.
TagMatch match_tag(const std::string& s, size_t pos, int* rank, size_t* length) {
  size_t i = pos;
  if (i >= s.size()) return TagMatch::kPartial;
  if (s[i++] != '[') return TagMatch::kNo;
  long long numbers[2] = {0, 0};
  const char stops[2] = {',', ']'};
  for (int k = 0; k < 2; ++k) {
    const size_t start = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (i - start >= 9) return TagMatch::kNo;
      numbers[k] = numbers[k] * 10 + (s[i++] - '0');
    }
    if (i >= s.size()) return TagMatch::kPartial;
    if (i == start || s[i++] != stops[k]) return TagMatch::kNo;
  }
  for (const char* word : {"<stdout>:", "<stderr>:", "<stddiag>:"}) {
    const size_t len = strlen(word), have = std::min(len, s.size() - i);
    if (s.compare(i, have, word, have) != 0) continue;
    if (have < len) return TagMatch::kPartial;
    *rank = static_cast<int>(numbers[1]);
    *length = i + len - pos;
    return TagMatch::kFull;
  }
  return TagMatch::kNo;
}

std::string rank_prefix(int rank) { return rank < 0 ? std::string() : "[rank " + std::to_string(rank) + "] "; }

// mpirun tags every line of a rank's output, and also each piece of one that
// it forwards before the line is complete (the piece ends without a newline,
// and whatever comes next, of any rank, starts with a tag). Pieces are
// collected per rank into whole lines, printed with the launcher's prefix;
// mpirun's own untagged messages pass through as they are.
void Launcher::emit_tagged(Stream& s, const char* data, size_t size) {
  s.raw.append(data, size);
  std::string out;
  size_t pos = 0;
  while (pos < s.raw.size()) {
    if (s.line_start) {
      int rank = -1;
      size_t len = 0;
      const TagMatch m = match_tag(s.raw, pos, &rank, &len);
      if (m == TagMatch::kPartial) break;
      s.line_start = false;
      if (m == TagMatch::kFull) {
        s.current = rank;
        pos += len;
        continue;
      }
      s.current = -1;
    }
    const size_t nl = s.raw.find('\n', pos);
    // A tag before the end of this line starts another rank's piece.
    size_t tag = std::string::npos;
    TagMatch tag_kind = TagMatch::kNo;
    for (size_t b = s.raw.find('[', pos); b != std::string::npos && b < nl; b = s.raw.find('[', b + 1)) {
      int rank;
      size_t len;
      tag_kind = match_tag(s.raw, b, &rank, &len);
      if (tag_kind != TagMatch::kNo) {
        tag = b;
        break;
      }
    }
    std::string& line = s.lines[s.current];
    if (tag != std::string::npos) {
      line.append(s.raw, pos, tag - pos);
      pos = tag;
      s.line_start = true;
      if (tag_kind == TagMatch::kPartial) break;
    } else if (nl != std::string::npos) {
      line.append(s.raw, pos, nl + 1 - pos);
      out += rank_prefix(s.current) + line;
      line.clear();
      pos = nl + 1;
      s.line_start = true;
    } else {
      line.append(s.raw, pos, std::string::npos);
      pos = s.raw.size();
    }
    if (line.size() >= kMaxPendingLine) {
      out += rank_prefix(s.current) + line + "\n";
      line.clear();
    }
  }
  s.raw.erase(0, pos);
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::flush_tagged(Stream& s) {
  if (!s.raw.empty()) {
    s.lines[s.line_start ? -1 : s.current] += s.raw;
    s.raw.clear();
  }
  std::string out;
  for (auto& kv : s.lines)
    if (!kv.second.empty()) out += rank_prefix(kv.first) + kv.second + "\n";
  s.lines.clear();
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::emit(Rank& r, Stream& s, const char* data, size_t size) {
  if (s.tagged) return emit_tagged(s, data, size);
  const size_t scanned = s.pending.size();
  s.pending.append(data, size);
  std::string out;
  size_t start = 0;
  for (size_t nl = s.pending.find('\n', scanned); nl != std::string::npos;
       nl = s.pending.find('\n', start)) {
    out += r.prefix;
    out.append(s.pending, start, nl + 1 - start);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= kMaxPendingLine) {
    out += r.prefix + s.pending + "\n";
    s.pending.clear();
  }
  // One write per chunk: lines of different ranks interleave only whole.
  if (!out.empty()) write_all(s.target, out);
}

void Launcher::close_stream(Rank& r, Stream& s) {
  if (s.tagged) flush_tagged(s);
  if (!s.pending.empty()) {
    write_all(s.target, r.prefix + s.pending + "\n");
    s.pending.clear();
  }
  if (s.fd >= 0) close(s.fd);
  s.fd = -1;
}

// Returns true when it read something.
bool Launcher::read_once(Rank& r, Stream& s) {
  static char buf[kReadChunk];
  ssize_t n = read(s.fd, buf, sizeof buf);
  if (n > 0) {
    emit(r, s, buf, static_cast<size_t>(n));
    return true;
  }
  if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) close_stream(r, s);
  return false;
}

// Reads what an exited rank left in its pipes, so its last words are printed
// before the launcher's verdict on it. Bounded: a descendant still holding the
// pipe could otherwise keep us here.
void Launcher::drain(Rank& r) {
  for (Stream* s : {&r.out, &r.err})
    for (int i = 0; i < 32 && s->fd >= 0; ++i)
      if (!read_once(r, *s)) break;
}

void Launcher::pump(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<std::pair<Rank*, Stream*>> owners;
  fds.push_back({signal_pipe_[0], POLLIN, 0});
  owners.emplace_back(nullptr, nullptr);
  for (Rank& r : ranks_)
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) {
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
  int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready > 0) {
    // One chunk per stream per round, so a chatty rank cannot starve the others.
    for (size_t i = 1; i < fds.size(); ++i)
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) read_once(*owners[i].first, *owners[i].second);
    if (fds[0].revents & POLLIN) {
      unsigned char signals[64];
      ssize_t n;
      while ((n = read(signal_pipe_[0], signals, sizeof signals)) > 0)
        for (ssize_t i = 0; i < n; ++i)
          if (signals[i] == kPeerNews) on_peer_news();
          else if (signals[i] != SIGCHLD) on_signal(signals[i]);
    }
  }
  // Every round, not only on SIGCHLD: cheap, and immune to a lost wake-up.
  reap();
}

}  // namespace launcher
}  // namespace shardplan_cli
