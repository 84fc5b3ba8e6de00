// Merging what several writers produced: the statistics of every shard into stats.safetensors,
// and the manifests of a ranked extract's ranks into one manifest.json (actcap/extract.h).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actcap/extract.h"
#include "export/faults.h"
#include "export/manifest.h"
#include "export/shard.h"

namespace actcap {

// Every shard's statistics (`shards`: their manifest entries, in order), each read back against its
// checksum, merged in shard order and written as DIR/stats.safetensors. Returns the manifest's
// "stats" entry. RunError naming the shard and tensor when one does not match.
nlohmann::json write_merged_stats(const std::string& dir, const EntrySource& shards,
                                  const ShardSchema& schema, FaultPoints* faults = nullptr);

// The rank manifests in DIR that an assembled manifest.json (`manifest`, its outline) was not
// assembled from: each rank it lists with a "manifest_xxh3" (XXH3 of that rank manifest's bytes
// as merged) whose rank-RRRRR-of-NNNNN.json is present in DIR with other bytes (the rank ran
// again). Empty when `manifest` records none (a single process's, or one assembled before the
// field was), or all match.
std::vector<std::string> stale_rank_manifests(const std::string& dir,
                                              const nlohmann::json& manifest);

// merge_ranks (actcap/extract.h) with a seam for tests: `after_write` runs once manifest.json is
// written, before merge looks again at whether a rank started again meanwhile.
MergeReport merge_ranks_observed(const std::string& dir, const std::vector<std::string>& sealed_as,
                                 int world_size, const std::function<void()>& after_write,
                                 const ExportFaults& faults = {});

}  // namespace actcap
