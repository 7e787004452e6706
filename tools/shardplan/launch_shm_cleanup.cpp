// The job's identity, and removing what its ranks left in /dev/shm.
//
// gloo's shared-memory path unlinks a segment's name as soon as every rank
// has mapped it, and on every failure it sees (plugins/comm_gloo/shm.h); a
// rank killed outright inside that window (SIGKILL, or SIGTERM, which runs
// no destructor) cannot. The segment, a few MiB per communicator, would then
// stay in RAM until reboot. Each rank gets SHARDPLAN_JOB_ID, which the
// plugin puts in every segment's name, so the launcher removes this job's
// names, and only this job's, once its ranks are gone. A launcher killed
// with SIGKILL cannot; the names also carry the process that created them,
// so the next launcher removes those whose creator is gone
// (plugins/comm_gloo/shm_names.h).
#include <dirent.h>

#include <random>

#include "comm_gloo/shm_names.h"
#include "launch_internal.h"

namespace shardplan_cli {
namespace launcher {

// 16 hex digits: no '-', which separates the id from the rest of a name.
const std::string& job_id() {
  static const std::string id = [] {
    std::random_device rd;
    const uint64_t x = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                       static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^
                       (static_cast<uint64_t>(getpid()) << 16);
    char buf[17];
    snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
    return std::string(buf);
  }();
  return id;
}

int remove_job_segments(const std::string& job) {
  const std::string prefix = "shardplan-gloo-" + job + "-";
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  int removed = 0;
  while (const dirent* e = readdir(dir)) {
    if (strncmp(e->d_name, prefix.c_str(), prefix.size()) != 0) continue;
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0) ++removed;
  }
  closedir(dir);
  if (removed > 0)
    say("removed " + std::to_string(removed) + " shared-memory segment(s) of this job from /dev/shm (" + prefix +
        "*), left by a rank that did not finish");
  return removed;
}

int remove_stale_segments() {
  const int removed = sp_gloo::shm_names::remove_stale();
  if (removed > 0)
    say("removed " + std::to_string(removed) + " shared-memory segment(s) from /dev/shm (" +
        sp_gloo::shm_names::kPrefix + "*) whose process is gone, left by a job that was killed");
  return removed;
}

}  // namespace launcher
}  // namespace shardplan_cli
