#include "raw_mpi.h"

#include <climits>
#include <stdexcept>

#include "shardplan/abi/comm.h"

#ifdef SHARDPLAN_BENCH_HAVE_MPI
#include <mpi.h>
#endif

namespace shardplan_bench {

#ifdef SHARDPLAN_BENCH_HAVE_MPI

namespace {

// MPI has no standard half types; those dtypes are not measured.
MPI_Datatype mpi_type(int32_t dt) {
  switch (dt) {
    case SP_FLOAT32: return MPI_FLOAT;
    case SP_FLOAT64: return MPI_DOUBLE;
    case SP_INT8: return MPI_INT8_T;
    case SP_UINT8: return MPI_UINT8_T;
    case SP_INT32: return MPI_INT32_T;
    case SP_INT64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;
  }
}

class RawMpiRank final : public Rank {
 public:
  explicit RawMpiRank(int32_t dt) : dt_(dt) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) MPI_Init(nullptr, nullptr);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~RawMpiRank() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool supports(Collective c) const override { return c == Collective::AllReduce; }
  std::string last_error() const override { return error_; }

  int run(const Call& c) override {
    const MPI_Datatype type = mpi_type(dt_);
    if (type == MPI_DATATYPE_NULL) {
      error_ = "MPI has no standard type for this dtype";
      return SP_ERR_UNSUPPORTED;
    }
    if (c.recv_count > static_cast<uint64_t>(INT_MAX)) {
      error_ = "count exceeds MPI's int";
      return SP_ERR_UNSUPPORTED;
    }
    const void* send = c.in_place ? MPI_IN_PLACE : c.send;
    int rc = MPI_Allreduce(send, c.recv, static_cast<int>(c.recv_count), type, MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) throw std::runtime_error("MPI_Allreduce failed with code " + std::to_string(rc));
    return 0;
  }

 private:
  const int32_t dt_;
  int rank_ = 0, size_ = 1;
  std::string error_;
};

}  // namespace

std::unique_ptr<Rank> make_raw_mpi_rank(int32_t dtype) { return std::make_unique<RawMpiRank>(dtype); }
bool have_raw_mpi() { return true; }

#else

std::unique_ptr<Rank> make_raw_mpi_rank(int32_t) { throw std::runtime_error("this build has no MPI"); }
bool have_raw_mpi() { return false; }

#endif

}  // namespace shardplan_bench
