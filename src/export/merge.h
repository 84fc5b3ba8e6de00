// Merging what several writers produced: the statistics of every shard into stats.safetensors,
// and the manifests of a ranked extract's ranks into one manifest.json (actcap/extract.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "export/faults.h"
#include "export/manifest.h"
#include "export/shard.h"

namespace actcap {

// Every shard's statistics (`shards`: their manifest entries, in order), each read back against its
// checksum, merged in shard order and written as DIR/stats.safetensors. Returns the manifest's
// "stats" entry. RunError naming the shard and tensor when one does not match.
nlohmann::json write_merged_stats(const std::string& dir, const EntrySource& shards,
                                  const ShardSchema& schema, FaultPoints* faults = nullptr);

}  // namespace actcap
