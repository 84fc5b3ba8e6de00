// Streaming per-feature statistics of captured points (`extract --stats`, docs/stats.md): count,
// mean, M2 (sum of squared deviations: variance = M2 / count), min, max, and the top-k rows of
// every feature by value with their (document, position, token). Accumulated in float64: each
// chunk of rows two-pass (exact mean, then M2), chunks, shards and resumed runs merged in row order
// with Chan's formula. Ties in the top-k go to the earlier row (document, then position), so the
// result depends only on the rows and their order, never on how they were cut into shards.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "export/shard.h"

namespace actcap {

struct FeatureStats {
  int64_t count = 0;
  at::Tensor mean, m2, min, max;  // float64 [...shape]
  // float64 [k, ...shape], best first; int64 [k, ...shape]: each entry's document line (or
  // sequence), position and token id. Unfilled entries (fewer than k rows): value -inf, ids -1.
  at::Tensor top_value, top_seq, top_pos, top_token;
};

// The statistics of `rows` [n, ...shape] (any floating dtype) with each row's sequence, position
// and token (int64 [n]), keeping the `k` largest values per feature.
FeatureStats stats_of(const at::Tensor& rows, const at::Tensor& seq, const at::Tensor& pos,
                      const at::Tensor& token, int64_t k);
// `a` then `b` (b's rows come after a's): the statistics of both (Chan et al.'s pairwise update).
FeatureStats merge_stats(const FeatureStats& a, const FeatureStats& b);

// The tensors of one point's statistics: `__stats__.POINT.{count,mean,m2,var,min,max}` and, with
// k > 0, `.top_value`, `.top_seq`, `.top_pos`, `.top_token` (docs/stats.md).
void stats_tensors(const std::string& point, const FeatureStats& s,
                   std::vector<std::pair<std::string, at::Tensor>>& out);
// Their names, dtypes and fixed shapes, for a point of per-token `shape`.
std::map<std::string, ShardSchema::Tensor> stats_schema(const std::string& point,
                                                        const std::vector<int64_t>& shape,
                                                        int64_t k);
// Reads one point's statistics back from tensors looked up by name.
FeatureStats stats_from(const std::string& point, int64_t k,
                        const std::function<at::Tensor(const std::string&)>& tensor);

}  // namespace actcap
