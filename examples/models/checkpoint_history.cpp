#include "models/checkpoint_history.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "shardplan/checkpoint_meta.h"
#include "shardplan/communicator.h"
#include "shardplan/error.h"
#include "shardplan/world.h"

namespace shardplan {
namespace examples {
namespace {

namespace fs = std::filesystem;

const char* const kStep = ".step-";

// N of "<base>.step-N" (digits only, at most 9), else -1.
int kept_step(const std::string& name, const std::string& base) {
  const std::string prefix = base + kStep;
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 9 || name.compare(0, prefix.size(), prefix))
    return -1;
  for (size_t i = prefix.size(); i < name.size(); ++i)
    if (name[i] < '0' || name[i] > '9') return -1;
  return std::stoi(name.substr(prefix.size()));
}

// Every DIR.step-N directory, N descending.
std::vector<std::pair<int, fs::path>> kept_copies(const fs::path& dir) {
  std::vector<std::pair<int, fs::path>> out;
  std::error_code ec;
  const fs::path parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const int n = kept_step(it->path().filename().string(), dir.filename().string());
    if (n >= 0 && it->is_directory(ec)) out.emplace_back(n, it->path());
  }
  std::sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.first > y.first; });
  return out;
}

fs::path normal(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "ckpt/"
  return p;
}

// Root's text on every rank.
std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  at::Tensor len = at::tensor({static_cast<int64_t>(text.size())}, at::kLong);
  comm.broadcast(len, root);
  const int64_t n = len.item<int64_t>();
  at::Tensor buf = at::zeros({std::max<int64_t>(n, 1)}, at::kByte);
  if (comm.rank() == root) std::memcpy(buf.data_ptr(), text.data(), text.size());
  comm.broadcast(buf, root);
  return std::string(reinterpret_cast<const char*>(buf.data_ptr()), static_cast<size_t>(n));
}

// Rank 0 alone changes files; its error, if any, is every rank's.
void agree_with_rank0(World& world, const std::string& err) {
  const std::string e = world.size() > 1 ? broadcast_text(world.comm(), err, 0) : err;
  if (!e.empty()) throw Error(e);
}

// "" when `mine` is "" on every rank, else the lowest failing rank's error:
// a rank whose load failed where the others' succeeded makes all of them go
// on to the next checkpoint together (each load replaces the whole model
// and optimizer state, so the one they all load last is what they hold).
std::string agreed_error(World& world, const std::string& mine) {
  if (world.size() == 1) return mine;
  at::Tensor failed = world.comm().all_gather(at::tensor({mine.empty() ? int64_t{0} : int64_t{1}}, at::kLong), 0);
  for (int r = 0; r < world.size(); ++r)
    if (failed[r].item<int64_t>() != 0) {
      const std::string e = broadcast_text(world.comm(), mine, r);
      return e.rfind("loading checkpoint", 0) == 0 ? e : "rank " + std::to_string(r) + ": " + e;
    }
  return "";
}

// A step attribute (from a file: anything) as a number, if it is one.
std::optional<int> parse_step(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoi(text);
}

// The step recorded in DIR's metadata, if it reads.
std::optional<int> recorded_step(const fs::path& dir) {
  try {
    std::ifstream in(dir / ckpt::kMetaFile, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    const ckpt::Meta meta = ckpt::parse_meta(text.str(), (dir / ckpt::kMetaFile).string());
    const auto it = meta.attributes.find("step");
    if (it == meta.attributes.end()) return std::nullopt;
    return parse_step(it->second);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// Renamed out of the candidates' names first, so a removal cut short never
// leaves a half-deleted checkpoint that looks like a kept one.
void remove_checkpoint(const fs::path& dir) {
  const fs::path doomed = dir.string() + ".removing";
  std::error_code ec;
  fs::remove_all(doomed, ec);
  fs::rename(dir, doomed);
  fs::remove_all(doomed);
}

}  // namespace

std::vector<std::string> resume_candidates(const std::string& dir) {
  const fs::path d = normal(dir);
  std::vector<std::string> out;
  std::error_code ec;
  if (fs::is_directory(d, ec) && !fs::is_empty(d, ec)) out.push_back(d.string());
  for (const auto& [n, path] : kept_copies(d)) out.push_back(path.string());
  return out;
}

std::optional<CheckpointHistory::Attributes> CheckpointHistory::resume(
    World& world, const std::function<Attributes(const std::string&)>& load, std::string* from) {
  // Rank 0's list, so every rank tries the same checkpoints in the same order.
  std::string list;
  if (world.rank() == 0)
    for (const auto& c : resume_candidates(dir_)) list += c + "\n";
  if (world.size() > 1) list = broadcast_text(world.comm(), list, 0);
  std::vector<std::string> candidates;
  std::istringstream lines(list);
  for (std::string c; std::getline(lines, c);) candidates.push_back(c);
  if (candidates.empty()) return std::nullopt;
  std::string reasons;
  for (const auto& c : candidates) {
    Attributes attributes;
    std::string err;
    try {
      attributes = load(c);  // load_checkpoint: it fails on every rank or on none
    } catch (const std::exception& e) {
      err = e.what();
      if (err.empty()) err = "failed";
    }
    err = agreed_error(world, err);
    if (err.empty()) {
      *from = c;
      if (c == normal(dir_).string()) {
        const auto it = attributes.find("step");
        if (it != attributes.end()) dir_step_ = parse_step(it->second);
      }
      return attributes;
    }
    skipped_.insert(c);
    reasons += (reasons.empty() ? "" : "; ") + err;
    if (world.rank() == 0) {
      std::printf("warning: --resume auto skipped checkpoint '%s': %s\n", c.c_str(), err.c_str());
      std::fflush(stdout);
    }
  }
  throw Error("--resume auto: none of the " + std::to_string(candidates.size()) + " checkpoint(s) of --save " +
              dir_ + " loads: " + reasons);
}

void CheckpointHistory::keep_current(int step) {
  const fs::path dir = normal(dir_);
  std::error_code ec;
  if (keep_ < 2 || skipped_.count(dir.string()) || !fs::exists(dir / ckpt::kMetaFile, ec)) return;
  const std::optional<int> current = dir_step_ ? dir_step_ : recorded_step(dir);
  if (!current || *current >= step) return;  // replaced, not kept: a step the run is redoing
  const fs::path copy = dir.string() + kStep + std::to_string(*current);
  const fs::path staging = copy.string() + ".partial";
  fs::remove_all(staging, ec);
  fs::create_directory(staging);
  // Hard links: no bytes copied, and the new save's files are new inodes,
  // so writing DIR never touches the copy. A filesystem without them copies.
  for (const auto& entry : fs::directory_iterator(dir)) {
    const fs::path to = staging / entry.path().filename();
    fs::create_hard_link(entry.path(), to, ec);
    if (ec) fs::copy_file(entry.path(), to);
  }
  fsync_dir(staging);
  ckpt::replace_directory(staging.string(), copy.string());
}

void CheckpointHistory::prune(int step) {
  const fs::path dir = normal(dir_);
  int kept = 1;  // DIR
  for (const auto& [n, path] : kept_copies(dir)) {
    if (n < step && !skipped_.count(path.string()) && kept < keep_) {
      ++kept;
      continue;
    }
    remove_checkpoint(path);
  }
  fsync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
}

void CheckpointHistory::save(World& world, int step, const std::function<void(const std::string&)>& write) {
  std::string err;
  if (world.rank() == 0) {
    try {
      keep_current(step);
    } catch (const std::exception& e) {
      err = "--keep " + std::to_string(keep_) + ": cannot keep the checkpoint in " + dir_ + " beside the new one: " +
            e.what();
    }
  }
  agree_with_rank0(world, err);
  write(dir_);
  dir_step_ = step;
  // Only now that the new checkpoint is complete does anything older go; a
  // failure here costs disk space, not the run.
  if (world.rank() == 0) {
    try {
      prune(step);
    } catch (const std::exception& e) {
      std::printf("warning: --keep %d: could not remove an older checkpoint of %s: %s\n", keep_, dir_.c_str(),
                  e.what());
      std::fflush(stdout);
    }
  }
  skipped_.clear();
}

}  // namespace examples
}  // namespace shardplan
