// Which files of an output folder one writer owns. A single process writes manifest.json,
// manifest.journal and shard-NNNNN.safetensors; rank R of an extract launched as N ranks
// (docs/scale.md) writes rank-RRRRR-of-NNNNN.json (its own manifest), rank-RRRRR-of-NNNNN.journal
// and shard-rRRRRR-NNNNN.safetensors, and the ranks' manifests are assembled into manifest.json
// once all of them are complete.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace actcap {

struct OutputLayout {
  int rank = 0, world_size = 1;
  bool ranked() const { return world_size > 1; }
  std::string manifest() const;            // manifest.json | rank-RRRRR-of-NNNNN.json
  std::string journal() const;             // manifest.journal | rank-RRRRR-of-NNNNN.journal
  std::string shard(int64_t index) const;  // shard-NNNNN | shard-rRRRRR-NNNNN (.safetensors)
  // The index i for which `file` is exactly shard(i); nullopt for any other name.
  std::optional<int64_t> shard_index(const std::string& file) const;
  // `file` (or a temp file for it) is this writer's: for a single process every output file, for
  // a rank its manifest, journal and shards.
  bool owns(const std::string& file) const;
};

// rank-RRRRR-of-NNNNN.json / .journal (or a temp file for one): its rank and world size.
struct RankFile {
  int rank = 0, world_size = 0;
  bool journal = false;
};
std::optional<RankFile> parse_rank_file(const std::string& name);
// shard-rRRRRR-NNNNN.safetensors (or a temp file for one): its rank.
std::optional<int> shard_rank(const std::string& name);

// The rank manifests in `dir`: world size -> the ranks that have one.
std::map<int, std::set<int>> rank_manifests(const std::string& dir);

}  // namespace actcap
