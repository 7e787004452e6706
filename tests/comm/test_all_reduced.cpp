// Communicator::all_reduced (out of place): the sum of every rank's tensor in
// a new contiguous tensor, the input untouched, on the local backend and on
// gloo's three paths (shared memory, the 2-rank TCP exchange, the TCP ring),
// at world sizes 1 to 4, contiguous or not, across the exchange's 1 MiB
// segments.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>
#include <vector>

#include "shardplan/communicator.h"
#include "shardplan/world.h"

namespace test_all_reduced {

namespace {

struct Path {
  std::string name, backend;
  std::vector<std::string> options;
};

const std::vector<Path>& paths() {
  static const std::vector<Path> all = {{"local", "local", {}},
                                        {"gloo_shm", "gloo", {}},
                                        {"gloo_tcp", "gloo", {"shm=off"}},
                                        {"gloo_tcp_ring", "gloo", {"shm=off", "tcp_all_reduce=ring"}}};
  return all;
}

class AllReduced : public ::testing::TestWithParam<std::tuple<size_t, int>> {};

TEST_P(AllReduced, SumsIntoANewTensorAndLeavesTheInput) {
  const Path& path = paths()[std::get<0>(GetParam())];
  const int n = std::get<1>(GetParam());
  shardplan::run_ranks_in_threads(
      n,
      [&](shardplan::World& w) {
        const double scale = w.rank() + 1, ranks_sum = n * (n + 1) / 2.0;
        // 300000 float64: 2.3 MiB, three segments of the TCP exchange.
        for (const int64_t rows : {int64_t(3), int64_t(1000)})
          for (const at::ScalarType dtype : {at::kFloat, at::kDouble}) {
            const at::Tensor base = at::arange(rows * 300, at::TensorOptions().dtype(dtype)).reshape({rows, 300});
            for (const bool contiguous : {true, false}) {
              const at::Tensor t = contiguous ? base * scale : (base * scale).t();
              const at::Tensor before = t.clone();
              const at::Tensor out = w.comm().all_reduced(t);
              SCOPED_TRACE(path.name + " rank " + std::to_string(w.rank()) + " rows " + std::to_string(rows));
              EXPECT_TRUE(out.is_contiguous());
              EXPECT_NE(out.data_ptr(), t.data_ptr());
              EXPECT_TRUE(at::equal(t, before));  // the input untouched
              const at::Tensor expected = contiguous ? base * ranks_sum : (base * ranks_sum).t();
              EXPECT_TRUE(at::equal(out, expected));
            }
          }
      },
      path.backend, path.options);
}

INSTANTIATE_TEST_SUITE_P(Paths, AllReduced, ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 2, 3, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<size_t, int>>& info) {
                           return paths()[std::get<0>(info.param)].name + "_ws" + std::to_string(std::get<1>(info.param));
                         });

}  // namespace

}  // namespace test_all_reduced
