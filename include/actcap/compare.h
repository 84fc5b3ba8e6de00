// Proof that a split run equals a single-device run: the same batch through the model on one
// device and as `split` places it, every captured point (and the logits) compared bit for bit.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/split.h"

namespace actcap {

struct CompareRow {
  std::string point;  // a captured point, or "logits"
  bool equal = false;
  double max_abs_diff = 0.0;                    // 1 for unequal integer tensors
  uint64_t reference_xxh3 = 0, split_xxh3 = 0;  // tensor_xxh3 (hash.h) of each side
};

struct CompareReport {
  std::vector<CompareRow> rows;  // points in model order, then "logits"
  DevicePlan plan;               // the split run's
  int64_t mismatched() const;
  bool equal() const { return mismatched() == 0; }
};

// Runs `batch` with everything on one device, then split as `split` says, capturing `patterns`
// (InputError when one matches nothing). Leaves the model placed as the split run had it.
CompareReport compare_split(Model& model, const Batch& batch,
                            const std::vector<std::string>& patterns, const SplitOptions& split);

}  // namespace actcap
