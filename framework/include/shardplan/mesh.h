#pragma once
// A device mesh: named axes over the world's ranks, laid out row-major (the
// last axis varies fastest, as torch's DeviceMesh). A process group exists per
// (axis, coordinates on the other axes).
#include <string>
#include <utility>
#include <vector>

namespace shardplan {

class Mesh {
 public:
  Mesh() = default;
  // Axis sizes must be >= 1 and names unique; throws shardplan::Error otherwise.
  explicit Mesh(std::vector<std::pair<std::string, int>> axes);

  int size() const;  // product of axis sizes
  int ndim() const { return static_cast<int>(axes_.size()); }
  const std::vector<std::pair<std::string, int>>& axes() const { return axes_; }
  bool has_axis(const std::string& axis) const;
  int axis_index(const std::string& axis) const;  // throws on unknown axis
  int axis_size(const std::string& axis) const;

  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  int coord(int rank, const std::string& axis) const;
  // The ranks that share every coordinate of `rank` but the one on `axis`,
  // ordered by their coordinate on `axis`.
  std::vector<int> group_ranks(int rank, const std::string& axis) const;
  // Identifies the group of `rank` along `axis` (equal for all its members,
  // distinct across groups): the color for Communicator::split.
  int group_color(int rank, const std::string& axis) const;

  std::string str() const;  // "{data: 2, model: 2}"

 private:
  std::vector<std::pair<std::string, int>> axes_;
};

}  // namespace shardplan
