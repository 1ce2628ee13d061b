#include "proto/mesh.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"

namespace strata {

absl::StatusOr<Mesh> Mesh::Create(std::vector<std::pair<std::string, int>> axes) {
  Mesh mesh;
  std::set<std::string> names;
  int64_t world = 1;
  for (const auto& [name, size] : axes) {
    if (name.empty()) return absl::InvalidArgumentError("mesh: an axis has no name");
    if (!names.insert(name).second) return absl::InvalidArgumentError(absl::StrCat("mesh: axis '", name, "' twice"));
    if (size < 1) return absl::InvalidArgumentError(absl::StrCat("mesh: axis '", name, "' has size ", size, ", expected >= 1"));
    world *= size;
    if (world > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(absl::StrCat("mesh: more than ", int64_t{1} << 20, " ranks"));
    }
  }
  mesh.axes_ = std::move(axes);
  mesh.world_size_ = static_cast<int>(world);
  return mesh;
}

absl::StatusOr<Mesh> Mesh::FromProto(const MeshShape& shape) {
  std::vector<std::pair<std::string, int>> axes;
  for (const MeshAxis& a : shape.axis()) axes.emplace_back(a.name(), a.size());
  return Create(std::move(axes));
}

MeshShape Mesh::ToProto() const {
  MeshShape shape;
  for (const auto& [name, size] : axes_) {
    MeshAxis* a = shape.add_axis();
    a->set_name(name);
    a->set_size(size);
  }
  return shape;
}

int Mesh::AxisIndex(absl::string_view name) const {
  for (int i = 0; i < num_axes(); ++i) {
    if (axes_[i].first == name) return i;
  }
  return -1;
}

int Mesh::AxisSize(absl::string_view name) const {
  const int i = AxisIndex(name);
  return i < 0 ? 1 : axes_[i].second;
}

std::vector<int> Mesh::Coordinates(int rank) const {
  std::vector<int> c(axes_.size());
  for (int i = num_axes() - 1; i >= 0; --i) {
    c[i] = rank % axes_[i].second;
    rank /= axes_[i].second;
  }
  return c;
}

int Mesh::Coordinate(int rank, absl::string_view axis) const {
  const int i = AxisIndex(axis);
  return i < 0 ? 0 : Coordinates(rank)[i];
}

int Mesh::RankOf(absl::Span<const int> coordinates) const {
  int rank = 0;
  for (int i = 0; i < num_axes(); ++i) rank = rank * axes_[i].second + coordinates[i];
  return rank;
}

int Mesh::WithCoordinate(int rank, absl::string_view axis, int value) const {
  const int i = AxisIndex(axis);
  if (i < 0) return rank;
  std::vector<int> c = Coordinates(rank);
  c[i] = value;
  return RankOf(c);
}

std::vector<int> Mesh::GroupRanks(int rank, absl::Span<const std::string> axes) const {
  std::vector<int> ranks;
  const std::vector<int> mine = Coordinates(rank);
  for (int r = 0; r < world_size_; ++r) {
    const std::vector<int> c = Coordinates(r);
    bool same = true;
    for (int i = 0; i < num_axes() && same; ++i) {
      const bool free = std::find(axes.begin(), axes.end(), axes_[i].first) != axes.end();
      same = free || c[i] == mine[i];
    }
    if (same) ranks.push_back(r);
  }
  return ranks;
}

std::vector<CommGroup> Mesh::GroupsOf(int rank) const {
  std::vector<CommGroup> groups;
  CommGroup world;
  world.set_id(0);
  for (const auto& [name, size] : axes_) world.add_axis(name);
  for (int r = 0; r < world_size_; ++r) world.add_rank(r);
  groups.push_back(std::move(world));
  int next_id = 1;
  const std::vector<int> mine = Coordinates(rank);
  for (int i = 0; i < num_axes(); ++i) {
    const int size = axes_[i].second;
    if (size <= 1) continue;
    // The axis's groups are numbered by the other coordinates in mixed radix
    // (the order of their lowest ranks).
    int index = 0;
    for (int j = 0; j < num_axes(); ++j) {
      if (j != i) index = index * axes_[j].second + mine[j];
    }
    CommGroup g;
    g.set_id(next_id + index);
    g.add_axis(axes_[i].first);
    for (int v = 0; v < size; ++v) g.add_rank(WithCoordinate(rank, axes_[i].first, v));
    groups.push_back(std::move(g));
    next_id += world_size_ / size;
  }
  return groups;
}

}  // namespace strata
