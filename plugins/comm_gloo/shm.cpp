// The same-host shared-memory path of the gloo plugin (shm.h).
#include "shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <gloo/allgather.h>
#include <gloo/broadcast.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "comm.h"
#include "run_gloo.h"
#include "shm_names.h"

namespace sp_gloo {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kMagic = 0x73686172646d656dULL;  // "shardmem"
constexpr size_t kHeaderBytes = 4096;               // header, then one flag per rank
constexpr size_t kMaxRanks = kHeaderBytes / 64 - 1;

struct Header {
  uint64_t magic;
  uint64_t nonce;
  uint32_t size;
  uint32_t slot_bytes;
};

std::string read_all(const char* path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string link_of(const char* path) {
  char buf[256];
  ssize_t n = readlink(path, buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("?");
}

// Ranks can share memory through shm_open when they run on one boot of one
// host and in the same IPC and mount namespaces; PID namespace too, so that
// a peer's pid can be checked for liveness.
uint64_t host_key() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string key = std::string(host) + "|" + read_all("/proc/sys/kernel/random/boot_id") + "|" +
                    link_of("/proc/self/ns/ipc") + "|" + link_of("/proc/self/ns/pid") + "|" +
                    link_of("/proc/self/ns/mnt");
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ULL;
  return h;
}

bool process_gone(int64_t pid) {
  if (pid == getpid()) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0) return errno == ESRCH;
  // A zombie still answers kill(); its state in /proc says it is gone.
  char state = 0;
  unsigned long long start = 0;
  return shm_names::read_process(static_cast<unsigned long long>(pid), state, start) && (state == 'Z' || state == 'X');
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t value, long ns) {
  timespec ts{0, ns};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, value, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Per-rank slot: big enough that a tensor-parallel activation moves in one
// chunk, small enough that the segment stays a few MiB.
size_t slot_bytes_for(int size) {
  size_t s = (size_t{8} << 20) / static_cast<size_t>(size);
  s = std::min<size_t>(std::max<size_t>(s, size_t{64} << 10), size_t{1} << 20);
  return s & ~size_t{4095};
}

struct Offer {
  int32_t ok;
  int32_t err;    // why rank 0 could not create it (errno), for every rank's message
  char name[160];  // "/shardplan-gloo-" + a job id of up to 24 + 3 numbers of up to 20 digits, serial, nonce
  uint64_t nonce;
};

// The name of the segment rank 0 created, until it is unlinked: at once when
// every rank has mapped it (the mappings outlive the name), and on any way
// out before that, so a failed attach leaves nothing in /dev/shm.
class OwnedName {
 public:
  OwnedName() = default;
  OwnedName(const OwnedName&) = delete;
  OwnedName& operator=(const OwnedName&) = delete;
  ~OwnedName() { unlink(); }
  void own(const char* name) { name_ = name; }
  void unlink() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

// A mapping of the segment, unmapped unless handed on to a ShmGroup.
struct Mapping {
  void* base = MAP_FAILED;
  size_t bytes = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
  void* release() { return std::exchange(base, MAP_FAILED); }
};

// The name says whose job it is and which process owns it (shm_names.h):
// the launcher removes its job's names, and anyone the names of owners
// that are gone. The first time a process creates a segment it removes
// such names itself, so ranks started without the launcher (srun) clean
// up after a killed job too.
void make_name(Offer& offer) {
  static std::atomic<unsigned> serial{0};
  static const shm_names::Owner me = [] {
    if (const int n = shm_names::remove_stale())
      std::fprintf(stderr, "gloo: removed %d shared-memory segment(s) from /dev/shm whose process is gone (%s*)\n", n,
                   shm_names::kPrefix);
    return shm_names::self();
  }();
  const char* job = std::getenv("SHARDPLAN_JOB_ID");
  if (!job || !*job || !valid_job_id(job)) job = "nojob";
  std::snprintf(offer.name, sizeof offer.name, "/%s%s-%llu-%llu-%llu-%u-%08x", shm_names::kPrefix, job, me.pid,
                me.start, me.pidns, serial.fetch_add(1), static_cast<unsigned>(offer.nonce));
}

// Test hook (tests/comm_gloo_shm.cmake): SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS=N
// makes every rank announce itself on stderr and sleep N ms with the segment
// created and opened but not yet unlinked, the window in which a killed rank
// must still leave nothing behind.
void test_pause(int rank, const char* name) {
  const char* env = std::getenv("SHARDPLAN_TEST_GLOO_SHM_PAUSE_MS");
  if (!env || !*env) return;
  const long ms = std::atol(env);
  std::fprintf(stderr, "gloo shm test pause: rank %d pid %ld pausing %ld ms with %s open\n", rank,
               static_cast<long>(getpid()), ms, name);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace

// A rank's barrier word, alone in its cache line: `seq` is the number of
// barriers it has reached (the futex word), `waiters` how many are asleep on it.
struct ShmGroup::Flag {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> waiters;
  std::atomic<uint32_t> gone;  // set when the rank leaves: aborted or destroyed
  char pad[52];
};
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain 32-bit atomics");

ShmGroup::ShmGroup(int rank, int size, std::chrono::milliseconds timeout, const std::atomic<bool>* aborted, void* base,
                   size_t bytes, size_t slot_bytes, std::vector<int64_t> pids)
    : rank_(rank), size_(size), timeout_(timeout), aborted_(aborted), base_(static_cast<uint8_t*>(base)),
      bytes_(bytes), slot_bytes_(slot_bytes), pids_(std::move(pids)),
      flags_(reinterpret_cast<Flag*>(base_ + 64)), banks_(base_ + kHeaderBytes) {}

ShmGroup::~ShmGroup() {
  leave();
  munmap(base_, bytes_);
}

// Peers waiting for this rank fail at once instead of at their timeout, as
// they do over TCP when its sockets close.
void ShmGroup::leave() {
  flags_[rank_].gone.store(1, std::memory_order_seq_cst);
  futex_wake_all(&flags_[rank_].seq);
}

uint8_t* ShmGroup::slot(int r) const {
  const size_t bank = static_cast<size_t>(chunks_ & 1);
  return banks_ + (bank * static_cast<size_t>(size_) + static_cast<size_t>(r)) * slot_bytes_;
}

void ShmGroup::begin() {
  if (broken_) throw RendezvousError(broken_why_, SP_ERR_INTERNAL);
  deadline_ = Clock::now() + timeout_;
}

void ShmGroup::wait_for(int peer, uint32_t target, Clock::time_point deadline) {
  Flag& f = flags_[peer];
  auto reached = [&] { return static_cast<int32_t>(f.seq.load(std::memory_order_acquire) - target) >= 0; };
  // A peer on another core usually arrives within microseconds; sleeping at
  // once would add two context switches to every barrier.
  for (int i = 0; i < 2000; ++i) {
    if (reached()) return;
    cpu_relax();
  }
  f.waiters.fetch_add(1, std::memory_order_seq_cst);
  auto last_check = Clock::now();
  std::string failure;
  int status = SP_OK;
  while (true) {
    const uint32_t seen = f.seq.load(std::memory_order_seq_cst);
    if (static_cast<int32_t>(seen - target) >= 0) break;
    futex_wait(&f.seq, seen, 10 * 1000 * 1000);
    if (reached()) break;
    if (f.gone.load(std::memory_order_seq_cst)) {
      status = SP_ERR_INTERNAL;
      failure = "rank " + std::to_string(peer) + " left the communicator (aborted, destroyed, or its process ended)";
      break;
    }
    if (aborted_ && aborted_->load()) {
      status = SP_ERR_ABORTED;
      failure = "the communicator was aborted";
      break;
    }
    const auto now = Clock::now();
    if (now - last_check >= std::chrono::milliseconds(100)) {
      last_check = now;
      if (process_gone(pids_[static_cast<size_t>(peer)])) {
        status = SP_ERR_INTERNAL;
        failure = "rank " + std::to_string(peer) + " (pid " + std::to_string(pids_[static_cast<size_t>(peer)]) +
                  ") has died";
        break;
      }
    }
    if (now >= deadline && !reached()) {
      status = SP_ERR_TIMEOUT;
      failure = "timed out after " + std::to_string(timeout_.count()) + " ms waiting for rank " +
                std::to_string(peer) + " in shared memory";
      break;
    }
  }
  f.waiters.fetch_sub(1, std::memory_order_seq_cst);
  if (status == SP_OK) return;
  broken_ = true;
  broken_why_ = "an earlier operation failed (" + failure + ")";
  throw RendezvousError(failure, status);
}

void ShmGroup::barrier() {
  const uint32_t target = ++epoch_;
  Flag& mine = flags_[rank_];
  mine.seq.store(target, std::memory_order_seq_cst);
  if (mine.waiters.load(std::memory_order_seq_cst) != 0) futex_wake_all(&mine.seq);
  for (int q = 0; q < size_; ++q)
    if (q != rank_) wait_for(q, target, deadline_);
}

void ShmGroup::all_reduce(const uint8_t* send, uint8_t* recv, size_t count, size_t es, ReduceFn fn) {
  begin();
  if (send != recv && shardplan::comm::overlaps(send, count * es, recv, count * es)) {
    std::memmove(recv, send, count * es);
    send = recv;
  }
  const size_t per_chunk = slot_bytes_ / es, n = static_cast<size_t>(size_);
  for (size_t c0 = 0; c0 < count; c0 += per_chunk, ++chunks_) {
    const size_t m = std::min(per_chunk, count - c0);
    auto lo = [&](size_t r) { return m * r / n; };
    std::memcpy(slot(rank_), send + c0 * es, m * es);
    barrier();
    // This rank's share of the chunk, reduced over all slots in rank order.
    const size_t a = lo(static_cast<size_t>(rank_)), b = lo(static_cast<size_t>(rank_) + 1);
    uint8_t* out = recv + (c0 + a) * es;
    if (b > a) {
      fn(out, slot(0) + a * es, slot(1) + a * es, b - a);
      for (int q = 2; q < size_; ++q) fn(out, out, slot(q) + a * es, b - a);
      std::memcpy(slot(rank_) + a * es, out, (b - a) * es);
    }
    barrier();
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      const size_t qa = lo(static_cast<size_t>(q)), qb = lo(static_cast<size_t>(q) + 1);
      std::memcpy(recv + (c0 + qa) * es, slot(q) + qa * es, (qb - qa) * es);
    }
  }
}

void ShmGroup::reduce_scatter(const uint8_t* send, uint8_t* recv, size_t count, size_t es, ReduceFn fn) {
  begin();
  const size_t n = static_cast<size_t>(size_), me = static_cast<size_t>(rank_);
  // recv may be this rank's block of send (in place): each chunk of send is
  // in the slot before the reduction writes that chunk of recv. Any other
  // overlap would let a write land on input still to be read.
  std::vector<uint8_t> copy;
  if (recv != send + me * count * es && shardplan::comm::overlaps(send, count * es * n, recv, count * es)) {
    copy.assign(send, send + count * es * n);
    send = copy.data();
  }
  const size_t per_chunk = slot_bytes_ / (es * n);
  for (size_t c0 = 0; c0 < count; c0 += per_chunk, ++chunks_) {
    const size_t k = std::min(per_chunk, count - c0);
    for (size_t q = 0; q < n; ++q) std::memcpy(slot(rank_) + q * k * es, send + (q * count + c0) * es, k * es);
    barrier();
    uint8_t* out = recv + c0 * es;
    fn(out, slot(0) + me * k * es, slot(1) + me * k * es, k);
    for (int q = 2; q < size_; ++q) fn(out, out, slot(q) + me * k * es, k);
  }
  // The last chunk's slots may be rewritten only after everyone has reduced
  // them; the next operation's first barrier guarantees that for the other
  // bank, this one for the bank just used.
  barrier();
}

void ShmGroup::all_gather(const uint8_t* send, uint8_t* recv, size_t count, size_t es) {
  begin();
  const size_t n = static_cast<size_t>(size_);
  const uint8_t* src = send;
  std::vector<uint8_t> copy;
  if (shardplan::comm::overlaps(send, count * es, recv, count * es * n) && send != recv + count * es * rank_) {
    copy.assign(send, send + count * es);
    src = copy.data();
  }
  const size_t per_chunk = slot_bytes_ / es;
  for (size_t c0 = 0; c0 < count; c0 += per_chunk, ++chunks_) {
    const size_t k = std::min(per_chunk, count - c0);
    std::memcpy(slot(rank_), src + c0 * es, k * es);
    barrier();
    for (size_t q = 0; q < n; ++q)
      if (q != static_cast<size_t>(rank_)) std::memcpy(recv + (q * count + c0) * es, slot(static_cast<int>(q)), k * es);
    if (recv + (rank_ * count + c0) * es != src + c0 * es)
      std::memmove(recv + (rank_ * count + c0) * es, src + c0 * es, k * es);
  }
  barrier();
}

bool parse_shm_mode(const std::string& v, ShmMode& out) {
  if (v == "auto") out = ShmMode::kAuto;
  else if (v == "on" || v == "1" || v == "true") out = ShmMode::kOn;
  else if (v == "off" || v == "0" || v == "false") out = ShmMode::kOff;
  else return false;
  return true;
}

bool valid_job_id(const std::string& v) {
  return !v.empty() && v.size() <= 24 &&
         std::all_of(v.begin(), v.end(), [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'; });
}

namespace {

struct Card {
  uint64_t host;
  int64_t pid;
};

// Rank 0: creates, sizes and maps the segment and writes its header, or
// says in the offer why not. The name is owned from the moment it exists.
void create_segment(Comm& c, Offer& offer, size_t bytes, size_t slot, OwnedName& name, Mapping& map) {
  std::random_device rd;
  offer.nonce = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(Clock::now().time_since_epoch().count());
  make_name(offer);
  const int fd = shm_open(offer.name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) name.own(offer.name);
  // posix_fallocate, not ftruncate alone: a full /dev/shm must fail here,
  // not raise SIGBUS at the first write into the segment.
  int err = fd < 0 ? errno : posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err == 0) map.base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (err == 0 && map.base == MAP_FAILED) err = errno;
  if (fd >= 0) close(fd);
  if (err != 0) {
    name.unlink();  // nobody else will open it: the offer says it failed
    offer.err = err;
    return;
  }
  std::memset(map.base, 0, kHeaderBytes);
  auto* h = static_cast<Header*>(map.base);
  h->nonce = offer.nonce;
  h->size = static_cast<uint32_t>(c.size);
  h->slot_bytes = static_cast<uint32_t>(slot);
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  offer.ok = 1;
}

// The other ranks: open and map rank 0's segment and check its header.
void open_segment(Comm& c, Offer& offer, size_t bytes, Mapping& map, std::string& why) {
  const int fd = shm_open(offer.name, O_RDWR, 0);
  struct stat st {};
  if (fd >= 0 && fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == bytes)
    map.base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (fd >= 0) close(fd);
  const auto* h = map.base == MAP_FAILED ? nullptr : static_cast<const Header*>(map.base);
  if (!h || h->magic != kMagic || h->nonce != offer.nonce || h->size != static_cast<uint32_t>(c.size))
    why = std::string("cannot attach ") + offer.name;
}

template <class T>
std::vector<T> all_gather_value(Comm& c, T mine) {
  std::vector<T> all(static_cast<size_t>(c.size));
  run_gloo(c, gloo::allgather, [&](auto& o) {
    o.setInput(reinterpret_cast<uint8_t*>(&mine), sizeof mine);
    o.setOutput(reinterpret_cast<uint8_t*>(all.data()), sizeof(T) * all.size());
  });
  return all;
}

}  // namespace

void attach_shm(Comm& c, ShmMode mode) {
  if (mode == ShmMode::kOff || c.size < 2) return;
  auto refuse = [&](const std::string& why) {
    if (mode == ShmMode::kOn) throw RendezvousError("shm=on, but shared memory cannot be used: " + why, SP_ERR_UNSUPPORTED);
  };
  if (static_cast<size_t>(c.size) > kMaxRanks) return refuse("more than " + std::to_string(kMaxRanks) + " ranks");

  const std::vector<Card> cards = all_gather_value(c, Card{host_key(), static_cast<int64_t>(getpid())});
  for (const Card& k : cards)
    if (k.host != cards[0].host) return refuse("the ranks are not all on one host");

  const size_t slot = slot_bytes_for(c.size);
  Offer offer{};
  OwnedName name;
  Mapping map;
  map.bytes = kHeaderBytes + 2 * static_cast<size_t>(c.size) * slot;
  std::string why;
  if (c.rank == 0) create_segment(c, offer, map.bytes, slot, name, map);
  run_gloo(c, gloo::broadcast, [&](auto& o) {
    o.setRoot(0);
    o.setOutput(reinterpret_cast<uint8_t*>(&offer), sizeof offer);
  });
  offer.name[sizeof offer.name - 1] = '\0';
  // Every rank has the offer, so all give up alike, with rank 0's reason.
  if (!offer.ok) return refuse(std::string("cannot create ") + offer.name + " (" + std::strerror(offer.err) + ")");
  if (c.rank != 0) open_segment(c, offer, map.bytes, map, why);
  test_pause(c.rank, offer.name);
  const std::vector<int32_t> oks = all_gather_value<int32_t>(c, map.base != MAP_FAILED && why.empty());
  name.unlink();  // everyone has mapped it (or given up): the mappings stay
  if (!std::all_of(oks.begin(), oks.end(), [](int32_t v) { return v != 0; }))
    return refuse(why.empty() ? "another rank could not attach the segment" : why);
  std::vector<int64_t> pids;
  for (const Card& k : cards) pids.push_back(k.pid);
  const size_t bytes = map.bytes;
  c.shm = std::make_shared<ShmGroup>(c.rank, c.size, c.timeout, &c.aborted, map.release(), bytes, slot, std::move(pids));
}

}  // namespace sp_gloo
