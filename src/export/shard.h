// The two pieces `run` (one shard) and `extract` (many) share: writing a shard so that nothing
// damaged is ever claimed, and the manifest fields every output folder has.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "actcap/model.h"

namespace actcap {

// shard-00000.safetensors, shard-00001.safetensors, ...
std::string shard_file_name(int64_t index);

struct WrittenShard {
  std::string file;          // name inside the folder
  nlohmann::json checksums;  // {tensor: XXH3-64 hex}, as in the shard's __metadata__
  uint64_t bytes = 0;
};

// Writes DIR/shard-<index> crash-safely (io/atomic_file.h) with the checksums and the weights'
// fingerprint in its __metadata__, then reads it back and re-hashes every tensor. On a mismatch
// the file is removed (a damaged shard never sits where a claimed one would) and RunError names
// the shard and the tensor. Test-only fault: ACTCAP_FAULT_SHARD=<index> flips one bit of the
// file between the write and the read-back.
WrittenShard write_checked_shard(const std::string& dir, int64_t index,
                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                 const std::string& model_fingerprint);

// format, complete (false), model (path, model_type, fingerprint), device_map, points (dtype
// and per-token shape of each planned point), rows (0), shards ([]).
nlohmann::json manifest_head(const Model& model, const std::vector<PointInfo>& plan);

}  // namespace actcap
