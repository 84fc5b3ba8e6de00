#include "actcap/compare.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/hash.h"

namespace actcap {

int64_t CompareReport::mismatched() const {
  int64_t bad = 0;
  for (const CompareRow& r : rows) bad += !r.within_tolerance;
  return bad;
}

int64_t CompareReport::bit_identical() const {
  int64_t n = 0;
  for (const CompareRow& r : rows) n += r.equal;
  return n;
}

CompareRow compare_tensors(const std::string& name, const at::Tensor& a, const at::Tensor& b,
                           double tolerance) {
  CompareRow row;
  row.point = name;
  row.equal = a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && at::equal(a, b);
  row.reference_xxh3 = tensor_xxh3(a);
  row.split_xxh3 = tensor_xxh3(b);
  if (!a.is_floating_point() || a.sizes() != b.sizes()) {
    row.max_abs_diff = row.equal ? 0.0 : 1.0;
    row.within_tolerance = row.equal;
    return row;
  }
  const at::Tensor ref = a.to(at::kDouble), got = b.to(at::kDouble);
  // Equal values (the same infinity on both sides, as in padded attention scores) differ by 0; a
  // NaN on either side that the other does not share makes the difference NaN, never within.
  const at::Tensor diff = at::where(ref.eq(got), at::zeros_like(ref), ref - got).abs();
  const at::Tensor finite_ref = at::where(at::isfinite(ref), ref, at::zeros_like(ref));
  row.max_abs_diff = diff.numel() ? diff.max().item<double>() : 0.0;
  row.max_abs_reference = finite_ref.numel() ? finite_ref.abs().max().item<double>() : 0.0;
  const double ref_norm = finite_ref.norm().item<double>();
  const double diff_norm = diff.norm().item<double>();
  row.rel_rms = diff_norm == 0.0 ? 0.0 : diff_norm / std::max(ref_norm, 1e-30);
  row.within_tolerance =
      row.equal ||
      (tolerance > 0.0 && row.max_abs_diff <= tolerance * std::max(row.max_abs_reference, 1e-30));
  return row;
}

void check_tolerance(double tolerance) {
  if (!(tolerance >= 0.0 && tolerance <= 1.0))  // NaN fails both
    throw InputError(
        concat("the tolerance must be a number from 0 (bit for bit) to 1, not ", tolerance),
        {"tolerance"});
}

CompareReport compare_split(Model& model, const Batch& batch,
                            const std::vector<std::string>& patterns, const SplitOptions& split,
                            double tolerance) {
  check_tolerance(tolerance);
  auto capture_run = [&](std::map<std::string, at::Tensor>& out) {
    CaptureOptions c{patterns};
    c.attention_keys = batch.max_len();  // attention patterns: every key of the batch
    SafeCapturer cap(model, c);
    out["logits"] = cap.run(batch).to(at::kCPU);
    for (const PointInfo& p : cap.plan()) out[p.name] = cap.get(p.name);
    return cap.plan();
  };
  std::map<std::string, at::Tensor> ref, other;
  model.place(ExecutionOptions{});  // everything on one device
  const std::vector<PointInfo> plan = capture_run(ref);
  CompareReport report;
  report.tolerance = tolerance;
  report.plan = split_model(model, split, batch.size(), batch.max_len(), plan);
  capture_run(other);
  std::vector<std::string> order;
  for (const PointInfo& p : plan) order.push_back(p.name);
  order.push_back("logits");
  for (const std::string& name : order)
    report.rows.push_back(compare_tensors(name, ref.at(name), other.at(name), tolerance));
  return report;
}

}  // namespace actcap
