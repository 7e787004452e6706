#pragma once
// The names of gloo's shared-memory segments (shm.h), and which of them are
// stale. A name is
//
//   /shardplan-gloo-<job>-<pid>-<start>-<pidns>-<serial>-<nonce>
//
// <job>: SHARDPLAN_JOB_ID (or "nojob"), so that `shardplan launch` removes
// its own job's names once its ranks are gone; <pid>, <start>, <pidns>: the
// process that created the segment, its start time (clock ticks after boot,
// field 22 of /proc/PID/stat) and its PID namespace (the inode of
// /proc/self/ns/pid); <serial>, <nonce>: unique within the process.
//
// Only the creator ever unlinks a name (the other ranks open it while the
// creator waits for them), so a name whose creator is gone will stay until
// reboot: a launcher killed with SIGKILL inside the attach window takes its
// ranks with it (PR_SET_PDEATHSIG) and nobody is left to remove the job's
// names. Such a name is useless too: no rank can attach without its creator,
// and removing a name never touches a mapping. So every launcher at start,
// and every rank that creates a segment (the first time in its process),
// removes the names whose creator is gone: its pid is free, or taken by a
// process that started at another time (the pid was reused), or a zombie.
// A name from another PID namespace cannot be checked and is left alone, as
// is any name not in this form.
//
// Header-only and torch-free: the plugin and the launcher (tools/shardplan)
// both include it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sp_gloo::shm_names {

constexpr const char* kPrefix = "shardplan-gloo-";  // in /dev/shm, without shm_open's '/'

struct Owner {
  unsigned long long pid = 0;
  unsigned long long start = 0;  // clock ticks after boot
  unsigned long long pidns = 0;  // 0: unknown
};

// A process's state letter and start time from /proc/PID/stat; false when
// there is no such process (in our PID namespace).
inline bool read_process(unsigned long long pid, char& state, unsigned long long& start) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return false;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and ')': fields 3 on follow
  // the last ')'.
  const char* p = std::strrchr(buf, ')');
  if (!p || p[1] != ' ') return false;
  p += 2;
  state = *p;
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return false;
    ++p;
  }
  char* end = nullptr;
  start = std::strtoull(p, &end, 10);
  return end != p;
}

inline unsigned long long pid_namespace() {
  struct stat st {};
  return stat("/proc/self/ns/pid", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
}

// This process, as a name's owner.
inline Owner self() {
  Owner o;
  o.pid = static_cast<unsigned long long>(getpid());
  char state = 0;
  if (!read_process(o.pid, state, o.start)) o.start = 0;
  o.pidns = pid_namespace();
  return o;
}

namespace detail {
inline bool number(const std::string& s, int base, unsigned long long& out) {
  if (s.empty() || s.size() > 20) return false;
  for (char ch : s)
    if (!(base == 16 ? std::isxdigit(static_cast<unsigned char>(ch)) : std::isdigit(static_cast<unsigned char>(ch))))
      return false;
  out = std::strtoull(s.c_str(), nullptr, base);
  return true;
}
}  // namespace detail

// The owner of a name as /dev/shm lists it (no leading '/'); false when it
// is not one of ours in the form above.
inline bool parse(const std::string& name, Owner& out) {
  const size_t prefix = std::strlen(kPrefix);
  if (name.compare(0, prefix, kPrefix) != 0) return false;
  std::vector<std::string> f;
  for (size_t at = prefix;;) {
    const size_t dash = name.find('-', at);
    f.push_back(name.substr(at, dash == std::string::npos ? std::string::npos : dash - at));
    if (dash == std::string::npos || f.size() > 6) break;
    at = dash + 1;
  }
  unsigned long long serial = 0, nonce = 0;
  return f.size() == 6 && !f[0].empty() && detail::number(f[1], 10, out.pid) && detail::number(f[2], 10, out.start) &&
         detail::number(f[3], 10, out.pidns) && detail::number(f[4], 10, serial) && f[5].size() == 8 &&
         detail::number(f[5], 16, nonce);
}

// True only when the owner is surely gone (see above); false when it may live.
inline bool owner_gone(const Owner& o, unsigned long long our_pidns) {
  if (o.pidns == 0 || our_pidns == 0 || o.pidns != our_pidns) return false;
  char state = 0;
  unsigned long long start = 0;
  if (!read_process(o.pid, state, start)) return true;
  return start != o.start || state == 'Z' || state == 'X';
}

// Removes from /dev/shm every name of this user whose owner is gone;
// returns how many.
inline int remove_stale() {
  DIR* dir = opendir("/dev/shm");
  if (!dir) return 0;
  const unsigned long long ns = pid_namespace();
  int removed = 0;
  while (const dirent* e = readdir(dir)) {
    Owner o;
    struct stat st {};
    // Only this user's: another's owner may be hidden from us (hidepid).
    if (!parse(e->d_name, o) || fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
        st.st_uid != geteuid() || !owner_gone(o, ns))
      continue;
    if (unlinkat(dirfd(dir), e->d_name, 0) == 0) ++removed;
  }
  closedir(dir);
  return removed;
}

}  // namespace sp_gloo::shm_names
