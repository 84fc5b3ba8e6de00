#include "actcap/compare.h"

#include <ATen/ATen.h>

#include <map>

#include "actcap/capture.h"
#include "actcap/hash.h"

namespace actcap {

int64_t CompareReport::mismatched() const {
  int64_t bad = 0;
  for (const CompareRow& r : rows) bad += !r.equal;
  return bad;
}

CompareReport compare_split(Model& model, const Batch& batch,
                            const std::vector<std::string>& patterns, const SplitOptions& split) {
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
  report.plan = split_model(model, split, batch.size(), batch.max_len(), plan);
  capture_run(other);
  std::vector<std::string> order;
  for (const PointInfo& p : plan) order.push_back(p.name);
  order.push_back("logits");
  for (const std::string& name : order) {
    const at::Tensor& a = ref.at(name);
    const at::Tensor& b = other.at(name);
    CompareRow row;
    row.point = name;
    row.equal = at::equal(a, b);
    row.max_abs_diff = a.is_floating_point() ? (a - b).abs().max().item<double>()
                                             : static_cast<double>(!row.equal);
    row.reference_xxh3 = tensor_xxh3(a);
    row.split_xxh3 = tensor_xxh3(b);
    report.rows.push_back(row);
  }
  return report;
}

}  // namespace actcap
