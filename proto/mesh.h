#ifndef STRATA_PROTO_MESH_H_
#define STRATA_PROTO_MESH_H_

// The device mesh: named parallel axes, outermost first, and the groups of
// ranks along them. Every rank/coordinate computation goes through here, so
// no code computes `rank % stages` by hand (CONVENTIONS.md 14).
//
// A rank's coordinates are its digits in the mixed radix of the axis sizes,
// the last axis varying fastest: with axes (dp, pp) rank = dp * |pp| + pp,
// and with (dp, pp, tp) rank = (dp * |pp| + pp) * |tp| + tp, as DESIGN.md
// says.

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/plan.pb.h"

namespace strata {

class Mesh {
 public:
  // Axes outermost first; names unique and non-empty, sizes >= 1, the world
  // at most 2^20 ranks.
  static absl::StatusOr<Mesh> Create(std::vector<std::pair<std::string, int>> axes);
  static absl::StatusOr<Mesh> FromProto(const MeshShape& shape);
  MeshShape ToProto() const;

  int world_size() const { return world_size_; }
  int num_axes() const { return static_cast<int>(axes_.size()); }
  const std::string& axis_name(int i) const { return axes_[i].first; }
  // The axis's index, or -1 when the mesh has no such axis.
  int AxisIndex(absl::string_view name) const;
  // The axis's size; 1 for an axis the mesh does not have.
  int AxisSize(absl::string_view name) const;

  std::vector<int> Coordinates(int rank) const;
  // Along one axis; 0 for an axis the mesh does not have.
  int Coordinate(int rank, absl::string_view axis) const;
  int RankOf(absl::Span<const int> coordinates) const;
  // `rank` moved to `value` along `axis` (the stage-s rank of this rank's pipeline).
  int WithCoordinate(int rank, absl::string_view axis, int value) const;

  // The ranks that share every coordinate with `rank` except along `axes`,
  // in rank order: `rank`'s group over those axes.
  std::vector<int> GroupRanks(int rank, absl::Span<const std::string> axes) const;

  // The groups `rank` belongs to, with ids the same on every rank: the world
  // (id 0), then one group for each axis of size > 1, in axis order, numbered
  // consecutively over all the mesh's groups of that axis.
  std::vector<CommGroup> GroupsOf(int rank) const;

 private:
  std::vector<std::pair<std::string, int>> axes_;
  int world_size_ = 1;
};

}  // namespace strata

#endif  // STRATA_PROTO_MESH_H_
