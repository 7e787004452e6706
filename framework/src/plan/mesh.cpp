#include "shardplan/mesh.h"

#include <set>

#include "shardplan/error.h"

namespace shardplan {

Mesh::Mesh(std::vector<std::pair<std::string, int>> axes) : axes_(std::move(axes)) {
  std::set<std::string> seen;
  for (const auto& [name, size] : axes_) {
    if (name.empty()) throw Error("mesh " + str() + ": axis names must not be empty");
    if (size < 1)
      throw Error("mesh " + str() + ": axis '" + name + "' has size " + std::to_string(size) +
                  " (must be >= 1)");
    if (!seen.insert(name).second) throw Error("mesh " + str() + ": axis '" + name + "' appears twice");
  }
}

int Mesh::size() const {
  int n = 1;
  for (const auto& axis : axes_) n *= axis.second;
  return n;
}

bool Mesh::has_axis(const std::string& axis) const {
  for (const auto& a : axes_)
    if (a.first == axis) return true;
  return false;
}

int Mesh::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].first == axis) return static_cast<int>(i);
  throw Error("mesh " + str() + " has no axis '" + axis + "'");
}

int Mesh::axis_size(const std::string& axis) const { return axes_[axis_index(axis)].second; }

std::vector<int> Mesh::coords(int rank) const {
  if (rank < 0 || rank >= size())
    throw Error("rank " + std::to_string(rank) + " is outside mesh " + str() + " of " +
                std::to_string(size()) + " ranks");
  // Row-major: peel the fastest (last) axis off first.
  std::vector<int> c(axes_.size());
  for (size_t i = axes_.size(); i-- > 0;) {
    c[i] = rank % axes_[i].second;
    rank /= axes_[i].second;
  }
  return c;
}

int Mesh::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != axes_.size())
    throw Error("mesh " + str() + " has " + std::to_string(axes_.size()) + " axes, got " +
                std::to_string(coords.size()) + " coordinates");
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= axes_[i].second)
      throw Error("coordinate " + std::to_string(coords[i]) + " is outside axis '" + axes_[i].first +
                  "' of size " + std::to_string(axes_[i].second));
    rank = rank * axes_[i].second + coords[i];
  }
  return rank;
}

int Mesh::coord(int rank, const std::string& axis) const { return coords(rank)[axis_index(axis)]; }

std::vector<int> Mesh::group_ranks(int rank, const std::string& axis) const {
  const int a = axis_index(axis);
  std::vector<int> c = coords(rank);
  std::vector<int> ranks;
  ranks.reserve(axes_[a].second);
  for (int i = 0; i < axes_[a].second; ++i) {
    c[a] = i;
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int Mesh::group_color(int rank, const std::string& axis) const {
  // The lowest rank of the group: equal for its members, and distinct across
  // groups because groups along one axis partition the ranks.
  std::vector<int> c = coords(rank);
  c[axis_index(axis)] = 0;
  return rank_of(c);
}

std::string Mesh::str() const {
  std::string s = "{";
  for (size_t i = 0; i < axes_.size(); ++i) {
    if (i) s += ", ";
    s += axes_[i].first + ": " + std::to_string(axes_[i].second);
  }
  return s + "}";
}

}  // namespace shardplan
