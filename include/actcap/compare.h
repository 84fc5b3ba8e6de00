// Proof that a split run equals a single-device run: the same batch through the model on one
// device and as `split` places it, every captured point (and the logits) compared bit for bit, or,
// where the two runs compute on different kinds of device (a GPU against the CPU), within a
// tolerance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/split.h"

namespace actcap {

struct CompareRow {
  std::string point;   // a captured point, or "logits"
  bool equal = false;  // bit for bit
  // Where the values differ (both sides equal, infinities included, count as no difference): the
  // largest |reference - split| (1 for unequal integer tensors), the largest |reference|, and
  // ||reference - split|| / ||reference|| (0 when the reference is all zeros and they are equal).
  double max_abs_diff = 0.0, max_abs_reference = 0.0, rel_rms = 0.0;
  bool within_tolerance =
      false;  // equal, or max_abs_diff <= tolerance * max(max_abs_reference, 1e-30)
  uint64_t reference_xxh3 = 0, split_xxh3 = 0;  // tensor_xxh3 (hash.h) of each side
};

struct CompareReport {
  std::vector<CompareRow> rows;  // points in model order, then "logits"
  DevicePlan plan;               // the split run's
  double tolerance = 0.0;        // as asked: 0 is bit for bit
  // Rows outside the tolerance (with tolerance 0: rows that are not bit-identical).
  int64_t mismatched() const;
  int64_t bit_identical() const;
  bool equal() const { return mismatched() == 0; }
};

// InputError unless 0 <= tolerance <= 1 (compare_split checks it; a caller may check it before
// loading a model).
void check_tolerance(double tolerance);

// One row: `reference` and `split` compared bit for bit, then by value (`tolerance` as below).
CompareRow compare_tensors(const std::string& name, const at::Tensor& reference,
                           const at::Tensor& split, double tolerance);

// Runs `batch` with everything on one device (plain cpu), then split as `split` says, capturing
// `patterns` (InputError when one matches nothing). `tolerance` 0 asks for every tensor to be
// bit-identical; above 0 (at most 1; InputError outside [0, 1]), for each to be within that
// fraction of its largest magnitude (for a split with a GPU, whose kernels round differently from
// the CPU's). Leaves the model placed as the split run had it.
CompareReport compare_split(Model& model, const Batch& batch,
                            const std::vector<std::string>& patterns, const SplitOptions& split,
                            double tolerance = 0.0);

}  // namespace actcap
