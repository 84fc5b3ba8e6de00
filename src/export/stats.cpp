#include "export/stats.h"

#include <limits>

namespace actcap {

namespace {

constexpr int64_t kChunkRows = 4096;  // rows widened to float64 at a time (bounded memory)

std::string stat_name(const std::string& point, const char* what) {
  return "__stats__." + point + "." + what;
}

at::Tensor f64(const at::Tensor& t) { return t.to(at::kDouble); }

// The k best of `values` [n, ...] (with ids [n, ...] each) per feature: value descending, ties to
// the lower index along dim 0 (stable sort). Candidates are given in row order, so the lower index
// is the earlier row. Pads to k entries with -inf / -1.
void keep_top(at::Tensor& values, at::Tensor& seq, at::Tensor& pos, at::Tensor& tok, int64_t k) {
  auto sorted = at::sort(values, /*stable=*/true, /*dim=*/0, /*descending=*/true);
  at::Tensor order = std::get<1>(sorted);
  const int64_t n = values.size(0), take = std::min(k, n);
  order = order.narrow(0, 0, take);
  values = std::get<0>(sorted).narrow(0, 0, take);
  seq = seq.gather(0, order);
  pos = pos.gather(0, order);
  tok = tok.gather(0, order);
  if (take < k) {
    std::vector<int64_t> pad_shape = values.sizes().vec();
    pad_shape[0] = k - take;
    values = at::cat(
        {values, at::full(pad_shape, -std::numeric_limits<double>::infinity(), values.options())});
    const at::Tensor minus = at::full(pad_shape, -1, seq.options());
    seq = at::cat({seq, minus});
    pos = at::cat({pos, minus});
    tok = at::cat({tok, minus});
  }
}

FeatureStats chunk_stats(const at::Tensor& rows, const at::Tensor& seq, const at::Tensor& pos,
                         const at::Tensor& token, int64_t k) {
  FeatureStats s;
  const at::Tensor x = f64(rows);
  s.count = x.size(0);
  s.mean = x.mean(0);
  s.m2 = (x - s.mean).square().sum(0);
  s.min = std::get<0>(x.min(0));
  s.max = std::get<0>(x.max(0));
  if (k > 0) {
    // The candidates: the k largest per feature (topk, no full sort), put back in row order so
    // that the stable sort breaks their ties by row. Exact unless a feature has more values equal
    // to its k-th than topk kept (ties cut at the boundary, which topk picks arbitrarily among):
    // then the whole chunk is sorted.
    const int64_t take = std::min(k, s.count);
    auto best = x.topk(take, 0, /*largest=*/true, /*sorted=*/true);
    at::Tensor cand = std::get<1>(best);
    const at::Tensor kth = std::get<0>(best).narrow(0, take - 1, 1);
    const bool cut_ties =
        (x == kth).sum(0).gt((x.gather(0, cand) == kth).sum(0)).any().item<bool>();
    if (cut_ties) {
      std::vector<int64_t> view(x.dim(), 1);
      view[0] = s.count;
      cand = at::arange(s.count, seq.options()).view(view).expand(x.sizes());
    }
    cand = std::get<0>(cand.contiguous().sort(0));  // row order
    s.top_value = x.gather(0, cand);
    s.top_seq = seq.index_select(0, cand.view(-1)).view(cand.sizes());
    s.top_pos = pos.index_select(0, cand.view(-1)).view(cand.sizes());
    s.top_token = token.index_select(0, cand.view(-1)).view(cand.sizes());
    keep_top(s.top_value, s.top_seq, s.top_pos, s.top_token, k);
  }
  return s;
}

FeatureStats empty_stats(const std::vector<int64_t>& shape, int64_t k) {
  FeatureStats s;
  const auto d = at::TensorOptions().dtype(at::kDouble);
  s.mean = at::zeros(shape, d);
  s.m2 = at::zeros(shape, d);
  s.min = at::full(shape, std::numeric_limits<double>::infinity(), d);
  s.max = at::full(shape, -std::numeric_limits<double>::infinity(), d);
  if (k > 0) {
    std::vector<int64_t> top = {k};
    top.insert(top.end(), shape.begin(), shape.end());
    s.top_value = at::full(top, -std::numeric_limits<double>::infinity(), d);
    s.top_seq = at::full(top, -1, at::kLong);
    s.top_pos = at::full(top, -1, at::kLong);
    s.top_token = at::full(top, -1, at::kLong);
  }
  return s;
}

}  // namespace

FeatureStats stats_of(const at::Tensor& rows, const at::Tensor& seq, const at::Tensor& pos,
                      const at::Tensor& token, int64_t k) {
  const int64_t n = rows.size(0);
  FeatureStats out = empty_stats(rows.sizes().slice(1).vec(), k);
  for (int64_t begin = 0; begin < n; begin += kChunkRows) {
    const int64_t len = std::min(kChunkRows, n - begin);
    out = merge_stats(out, chunk_stats(rows.narrow(0, begin, len), seq.narrow(0, begin, len),
                                       pos.narrow(0, begin, len), token.narrow(0, begin, len), k));
  }
  return out;
}

FeatureStats merge_stats(const FeatureStats& a, const FeatureStats& b) {
  if (b.count == 0) return a;  // nothing to add (its top-k is padding only)
  if (a.count == 0) return b;
  FeatureStats s;
  s.count = a.count + b.count;
  const double na = static_cast<double>(a.count), nb = static_cast<double>(b.count),
               n = static_cast<double>(s.count);
  const at::Tensor delta = b.mean - a.mean;
  s.mean = a.mean + delta * (nb / n);
  s.m2 = a.m2 + b.m2 + delta.square() * (na * nb / n);
  s.min = at::minimum(a.min, b.min);
  s.max = at::maximum(a.max, b.max);
  if (a.top_value.defined()) {
    const int64_t k = a.top_value.size(0);
    s.top_value = at::cat({a.top_value, b.top_value});
    s.top_seq = at::cat({a.top_seq, b.top_seq});
    s.top_pos = at::cat({a.top_pos, b.top_pos});
    s.top_token = at::cat({a.top_token, b.top_token});
    keep_top(s.top_value, s.top_seq, s.top_pos, s.top_token, k);
  }
  return s;
}

void stats_tensors(const std::string& point, const FeatureStats& s,
                   std::vector<std::pair<std::string, at::Tensor>>& out) {
  out.emplace_back(stat_name(point, "count"), at::full({1}, s.count, at::kLong));
  out.emplace_back(stat_name(point, "mean"), s.mean.contiguous());
  out.emplace_back(stat_name(point, "m2"), s.m2.contiguous());
  // Population variance (numpy's var, ddof=0); NaN for no rows.
  out.emplace_back(stat_name(point, "var"),
                   s.count > 0 ? (s.m2 / static_cast<double>(s.count)).contiguous()
                               : at::full_like(s.m2, std::numeric_limits<double>::quiet_NaN()));
  out.emplace_back(stat_name(point, "min"), s.min.contiguous());
  out.emplace_back(stat_name(point, "max"), s.max.contiguous());
  if (s.top_value.defined()) {
    out.emplace_back(stat_name(point, "top_value"), s.top_value.contiguous());
    out.emplace_back(stat_name(point, "top_seq"), s.top_seq.contiguous());
    out.emplace_back(stat_name(point, "top_pos"), s.top_pos.contiguous());
    out.emplace_back(stat_name(point, "top_token"), s.top_token.contiguous());
  }
}

std::map<std::string, ShardSchema::Tensor> stats_schema(const std::string& point,
                                                        const std::vector<int64_t>& shape,
                                                        int64_t k) {
  std::map<std::string, ShardSchema::Tensor> out;
  auto fixed = [](std::string dtype, std::vector<int64_t> s) {
    ShardSchema::Tensor t{std::move(dtype), std::move(s)};
    t.per_row = false;
    return t;
  };
  out[stat_name(point, "count")] = fixed("I64", {1});
  for (const char* what : {"mean", "m2", "var", "min", "max"})
    out[stat_name(point, what)] = fixed("F64", shape);
  if (k > 0) {
    std::vector<int64_t> top = {k};
    top.insert(top.end(), shape.begin(), shape.end());
    out[stat_name(point, "top_value")] = fixed("F64", top);
    for (const char* what : {"top_seq", "top_pos", "top_token"})
      out[stat_name(point, what)] = fixed("I64", top);
  }
  return out;
}

FeatureStats stats_from(const std::string& point, int64_t k,
                        const std::function<at::Tensor(const std::string&)>& tensor) {
  FeatureStats s;
  s.count = tensor(stat_name(point, "count")).item<int64_t>();
  s.mean = tensor(stat_name(point, "mean"));
  s.m2 = tensor(stat_name(point, "m2"));
  s.min = tensor(stat_name(point, "min"));
  s.max = tensor(stat_name(point, "max"));
  if (k > 0) {
    s.top_value = tensor(stat_name(point, "top_value"));
    s.top_seq = tensor(stat_name(point, "top_seq"));
    s.top_pos = tensor(stat_name(point, "top_pos"));
    s.top_token = tensor(stat_name(point, "top_token"));
  }
  return s;
}

}  // namespace actcap
