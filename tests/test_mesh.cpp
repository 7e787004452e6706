// Mesh: row-major rank layout (last axis fastest, as torch's DeviceMesh) and
// the per-axis process groups derived from it.
#include <gtest/gtest.h>

#include <algorithm>

#include "shardplan/error.h"
#include "shardplan/mesh.h"

namespace test_mesh {

using shardplan::Error;
using shardplan::Mesh;

TEST(Mesh, OneAxis) {
  Mesh m({{"model", 4}});
  EXPECT_EQ(m.size(), 4);
  EXPECT_EQ(m.ndim(), 1);
  EXPECT_EQ(m.str(), "{model: 4}");
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(m.coords(r), std::vector<int>{r});
    EXPECT_EQ(m.group_ranks(r, "model"), (std::vector<int>{0, 1, 2, 3}));
    EXPECT_EQ(m.group_color(r, "model"), m.group_color(0, "model"));
  }
}

TEST(Mesh, TwoAxesCoordsAreRowMajor) {
  Mesh m({{"data", 2}, {"model", 2}});
  EXPECT_EQ(m.size(), 4);
  EXPECT_EQ(m.str(), "{data: 2, model: 2}");
  EXPECT_EQ(m.coords(0), (std::vector<int>{0, 0}));
  EXPECT_EQ(m.coords(1), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.coords(2), (std::vector<int>{1, 0}));
  EXPECT_EQ(m.coords(3), (std::vector<int>{1, 1}));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(m.rank_of(m.coords(r)), r);
  EXPECT_EQ(m.coord(2, "data"), 1);
  EXPECT_EQ(m.coord(2, "model"), 0);
  EXPECT_EQ(m.axis_index("model"), 1);
  EXPECT_EQ(m.axis_size("data"), 2);
  EXPECT_TRUE(m.has_axis("data"));
  EXPECT_FALSE(m.has_axis("pipe"));
}

TEST(Mesh, TwoAxesSubGroups) {
  Mesh m({{"data", 2}, {"model", 2}});
  EXPECT_EQ(m.group_ranks(0, "model"), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks(1, "model"), (std::vector<int>{0, 1}));
  EXPECT_EQ(m.group_ranks(2, "model"), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group_ranks(3, "model"), (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group_ranks(0, "data"), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group_ranks(2, "data"), (std::vector<int>{0, 2}));
  EXPECT_EQ(m.group_ranks(1, "data"), (std::vector<int>{1, 3}));
  EXPECT_EQ(m.group_ranks(3, "data"), (std::vector<int>{1, 3}));
}

TEST(Mesh, GroupColorsPartitionTheRanks) {
  Mesh m({{"pipe", 2}, {"data", 3}, {"model", 2}});
  for (const auto& [axis, size] : m.axes()) {
    for (int r = 0; r < m.size(); ++r) {
      for (int other = 0; other < m.size(); ++other) {
        const auto group = m.group_ranks(r, axis);
        const bool same_group = std::find(group.begin(), group.end(), other) != group.end();
        EXPECT_EQ(m.group_color(r, axis) == m.group_color(other, axis), same_group)
            << axis << " " << r << " " << other;
      }
      EXPECT_EQ(static_cast<int>(m.group_ranks(r, axis).size()), size);
    }
  }
  // Ordered by the coordinate on the axis; the data group of rank 5 (coords 0,2,1).
  EXPECT_EQ(m.group_ranks(5, "data"), (std::vector<int>{1, 3, 5}));
}

TEST(Mesh, InvalidAxes) {
  EXPECT_THROW(Mesh({{"model", 0}}), Error);
  EXPECT_THROW(Mesh({{"model", -1}}), Error);
  EXPECT_THROW(Mesh({{"model", 2}, {"model", 2}}), Error);
  EXPECT_THROW(Mesh({{"", 2}}), Error);
  try {
    Mesh({{"data", 2}, {"data", 1}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("axis 'data' appears twice"), std::string::npos) << e.what();
  }
}

TEST(Mesh, InvalidQueries) {
  Mesh m({{"data", 2}, {"model", 2}});
  EXPECT_THROW(m.coords(4), Error);
  EXPECT_THROW(m.coords(-1), Error);
  EXPECT_THROW(m.axis_index("pipe"), Error);
  EXPECT_THROW(m.group_ranks(0, "pipe"), Error);
  EXPECT_THROW(m.rank_of({0}), Error);
  EXPECT_THROW(m.rank_of({0, 2}), Error);
}

TEST(Mesh, EmptyMeshIsOneRank) {
  Mesh m;
  EXPECT_EQ(m.size(), 1);
  EXPECT_EQ(m.ndim(), 0);
  EXPECT_EQ(m.str(), "{}");
}

}  // namespace test_mesh
