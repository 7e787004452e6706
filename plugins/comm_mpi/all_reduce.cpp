// all_reduce, and which algorithm runs it: our own over point-to-point
// messages (OwnAllReduce) where Open MPI's MPI_Iallreduce is slow, MPI's above.
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "api.h"
#include "comm.h"
#include "mpi_support.h"
#include "process.h"
#include "shardplan/abi/comm.h"
#include "shardplan/comm_plugin.h"
#include "validation.h"

namespace sp_mpi {
namespace {

// all_reduce up to kOwnAllReduceBytes runs OwnAllReduce rather than
// MPI_Iallreduce; above, bandwidth rules and MPI_Iallreduce keeps up.
constexpr size_t kOwnAllReduceBytes = 64 * 1024;

// Whether OwnAllReduce should halve (Rabenseifner) rather than double for a
// buffer of `bytes`. What decides below 16 KiB is how many messages need a
// rendezvous: Open MPI's shared-memory transport sends up to 4 KiB
// (header included) eagerly and costs ~3 us more per message above. Doubling
// sends the whole buffer log2(size) times, halving twice as many messages of
// half the size and less. Measured on 2 ranks with benchmarks/comm_mpi
// against MPI_Allreduce: 4 KiB doubling 3.4 us (one rendezvous) against
// 1.5 us halving (eager halves) and 1.2 us raw; 8 KiB doubling 4.4 us (one
// rendezvous) against 6.9 us halving (two) and 4.1 us raw.
bool halve_for(size_t bytes) {
  if (bytes <= 2048) return false;       // every message eager: fewest steps
  if (bytes <= 4096) return true;        // halves still eager
  if (bytes <= 16 * 1024) return false;  // all rendezvous: fewest messages
  return true;                           // bytes moved dominate
}

// All-reduce in place over point-to-point messages on own_mc, for buffers
// where Open MPI's MPI_Iallreduce is slow: its nonblocking collectives build
// a schedule per call (~0.7 us against MPI_Allreduce's 0.3 us for 8 bytes on
// 2 ranks). Our requests are polled like any other, so these still time out
// and abort. Two algorithms, as MPI_Allreduce itself picks (and as MPICH
// writes them): recursive doubling, log2(size) exchanges of the whole buffer,
// for the smallest buffers; reduce-scatter by recursive halving then
// all-gather by recursive doubling (Rabenseifner), whose messages halve, up to
// kOwnAllReduceBytes. A group that is no power of two first folds its extra
// ranks into partners and hands them the result last. Every rank ends with
// the same bits: in recursive doubling both partners combine the same two
// partial results (our ops are commutative); in Rabenseifner each piece is
// reduced on one rank and copied to the others. MPI_Reduce_local serves our
// half-precision ops too.
class OwnAllReduce {
 public:
  OwnAllReduce(Comm& c, const char* op, std::string& err, char* data, int count, MPI_Datatype dt, MPI_Op mop,
               size_t elem)
      : c_(c), op_(op), err_(err), data_(data), count_(count), dt_(dt), mop_(mop), elem_(elem),
        incoming_(c.scratch) {
    if (incoming_.size() < static_cast<size_t>(count) * elem) incoming_.resize(static_cast<size_t>(count) * elem);
    while (pof2_ * 2 <= c.size) pof2_ *= 2;
    extra_ = c.size - pof2_;
    const int me = c.rank;
    // Ranks 0 .. 2*extra-1 pair up; the even one of a pair sits the doubling out.
    vrank_ = me < 2 * extra_ ? (me % 2 ? me / 2 : -1) : me - extra_;
  }

  int run(bool halving) {
    const int me = c_.rank;
    int st = SP_OK;
    if (me < 2 * extra_) {
      if (me % 2 == 0) st = exchange(me + 1, data_, count_, nullptr, 0);
      else if ((st = exchange(me - 1, nullptr, 0, in(), count_)) == SP_OK) st = reduce(0, count_);
    }
    if (st == SP_OK && vrank_ >= 0) st = halving ? halving_doubling() : doubling();
    if (st != SP_OK || me >= 2 * extra_) return st;
    return me % 2 ? exchange(me - 1, data_, count_, nullptr, 0) : exchange(me + 1, nullptr, 0, data_, count_);
  }

 private:
  int peer_of(int vpeer) const { return vpeer < extra_ ? vpeer * 2 + 1 : vpeer + extra_; }

  // Sends `scount` elements from `sbuf` to `peer` and receives `rcount` into
  // `rbuf` from it (either may be empty).
  int exchange(int peer, const char* sbuf, int scount, char* rbuf, int rcount) {
    MPI_Request q[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    int rc = MPI_SUCCESS;
    {
      MpiLock lock;
      if (rbuf) rc = MPI_Irecv(rbuf, rcount, dt_, peer, 0, c_.own_mc, &q[0]);
      if (rc == MPI_SUCCESS && sbuf) rc = MPI_Isend(sbuf, scount, dt_, peer, 0, c_.own_mc, &q[1]);
    }
    if (rc != MPI_SUCCESS) {
      // A posted receive must not outlive the buffer behind it.
      if (q[0] != MPI_REQUEST_NULL) c_.give_up(q, 1, &incoming_);
      err_ = mpi_error(rc);
      return SP_ERR_INTERNAL;
    }
    return c_.complete(op_, q, 2, err_, nullptr, &incoming_);
  }

  // data[first, first + n) = incoming[first, ...) op data[first, ...).
  int reduce(int first, int n) {
    if (n == 0) return SP_OK;
    int rc;
    {
      MpiLock lock;
      rc = MPI_Reduce_local(at(in(), first), at(data_, first), n, dt_, mop_);
    }
    if (rc == MPI_SUCCESS) return SP_OK;
    err_ = "MPI_Reduce_local: " + mpi_error(rc);
    return SP_ERR_INTERNAL;
  }

  char* in() { return reinterpret_cast<char*>(incoming_.data()); }
  char* at(char* base, int element) const { return base + static_cast<size_t>(element) * elem_; }

  int doubling() {
    for (int mask = 1; mask < pof2_; mask <<= 1) {
      int st = exchange(peer_of(vrank_ ^ mask), data_, count_, in(), count_);
      if (st == SP_OK) st = reduce(0, count_);
      if (st != SP_OK) return st;
    }
    return SP_OK;
  }

  // Element offset of piece i of pof2 near-equal pieces.
  int piece(int i) const {
    const int base = count_ / pof2_, rest = count_ % pof2_;
    return i * base + std::min(i, rest);
  }

  // Pieces [lo, hi) are this rank's part of the buffer; each step of the
  // reduce-scatter halves it, keeping the half on this rank's side of its
  // partner, and the all-gather retraces the steps backwards.
  int halving_doubling() {
    int lo = 0, hi = pof2_;
    std::vector<std::pair<int, int>> kept;  // [lo, hi) before each step
    for (int mask = pof2_ / 2; mask >= 1; mask >>= 1) {
      const int vpeer = vrank_ ^ mask, mid = lo + (hi - lo) / 2;
      const bool low = vrank_ < vpeer;
      const int keep_lo = low ? lo : mid, keep_hi = low ? mid : hi;
      const int give_lo = low ? mid : lo, give_hi = low ? hi : mid;
      int st = exchange(peer_of(vpeer), at(data_, piece(give_lo)), piece(give_hi) - piece(give_lo),
                        at(in(), piece(keep_lo)), piece(keep_hi) - piece(keep_lo));
      if (st == SP_OK) st = reduce(piece(keep_lo), piece(keep_hi) - piece(keep_lo));
      if (st != SP_OK) return st;
      kept.emplace_back(lo, hi);
      lo = keep_lo;
      hi = keep_hi;
    }
    for (int mask = 1; mask < pof2_; mask <<= 1) {
      const int vpeer = vrank_ ^ mask;
      const auto [plo, phi] = kept.back();
      kept.pop_back();
      // The partner holds the other half of [plo, phi), now fully reduced.
      const int other_lo = lo == plo ? hi : plo, other_hi = lo == plo ? phi : lo;
      int st = exchange(peer_of(vpeer), at(data_, piece(lo)), piece(hi) - piece(lo), at(data_, piece(other_lo)),
                        piece(other_hi) - piece(other_lo));
      if (st != SP_OK) return st;
      lo = plo;
      hi = phi;
    }
    return SP_OK;
  }

  Comm& c_;
  const char* op_;
  std::string& err_;
  char* const data_;
  const int count_;
  const MPI_Datatype dt_;
  const MPI_Op mop_;
  const size_t elem_;
  std::vector<uint8_t>& incoming_;
  int pof2_ = 1, extra_ = 0, vrank_ = 0;
};

}  // namespace

int api_all_reduce(sp_comm* comm, const sp_buffer* send, const sp_buffer* recv, int32_t op, sp_work** work) {
  const char* name = "all_reduce";
  if (int rc = check_comm(name, comm)) return rc;
  if (int rc = check_pair(name, send, recv)) return rc;
  if (send->count != recv->count)
    return count_mismatch(name, "send has " + std::to_string(send->count) + " elements but recv has " +
                                    std::to_string(recv->count));
  if (int rc = check_op(name, op)) return rc;
  if (int rc = check_mpi_count(name, recv->count)) return rc;
  Comm* c = comm->impl.get();
  const sp_buffer s = *send, r = *recv;
  const MPI_Datatype dt = mpi_type(r.dtype);
  const MPI_Op mop = mpi_op(r.dtype, op);
  const size_t nbytes = r.count * dtype_size(r.dtype);
  return c->submit(
      name,
      [c, s, r, dt, mop, nbytes, name](std::string& err) -> int {
        if (r.count == 0) return SP_OK;
        if (nbytes <= kOwnAllReduceBytes && c->size > 1) {
          if (s.data != r.data) std::memmove(r.data, s.data, nbytes);
          OwnAllReduce ar(*c, name, err, static_cast<char*>(r.data), static_cast<int>(r.count), dt, mop,
                          dtype_size(r.dtype));
          return ar.run(halve_for(nbytes));
        }
        const void* src = s.data;
        // MPI forbids aliased buffers; in place covers any overlap.
        if (s.data == r.data || overlaps(s.data, nbytes, r.data, nbytes)) {
          std::memmove(r.data, s.data, nbytes);
          src = MPI_IN_PLACE;
        }
        return run_one(*c, name, err, [&](MPI_Request* q) {
          return MPI_Iallreduce(src, r.data, static_cast<int>(r.count), dt, mop, c->mc, q);
        });
      },
      work);
}

}  // namespace sp_mpi
