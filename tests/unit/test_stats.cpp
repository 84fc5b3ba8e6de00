// Streaming statistics (export/stats.h): Chan's merge of any split of the rows equals the
// statistics of all of them, the top-k is the k largest per feature with ties to the earlier row
// whatever the split, padding when fewer rows than k, and the tensors round-trip.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "export/stats.h"

using namespace actcap;

namespace {

template <typename T>
std::vector<T> list(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().view(-1);
  return std::vector<T>(c.data_ptr<T>(), c.data_ptr<T>() + c.numel());
}

struct Rows {
  at::Tensor x, seq, pos, tok;
  Rows slice(int64_t a, int64_t b) const {
    return {x.slice(0, a, b), seq.slice(0, a, b), pos.slice(0, a, b), tok.slice(0, a, b)};
  }
};

Rows rows(int64_t n, int64_t f) {
  at::manual_seed(5);
  Rows r;
  r.x = at::randn({n, f}, at::kFloat);
  r.x.slice(0, n / 2, n / 2 + 3).copy_(r.x.slice(0, 1, 4));  // tied values, later rows
  r.seq = at::arange(n, at::kLong).div(7, "floor");
  r.pos = at::arange(n, at::kLong).remainder(7);
  r.tok = at::arange(n, at::kLong).mul(3);
  return r;
}

FeatureStats of(const Rows& r, int64_t k) { return stats_of(r.x, r.seq, r.pos, r.tok, k); }

}  // namespace

TEST(Stats, AnySplitMergesToTheStatisticsOfAllRows) {
  const Rows r = rows(9000, 6);  // more than one 4096-row chunk
  const FeatureStats all = of(r, 4);
  const at::Tensor x = r.x.to(at::kDouble);
  EXPECT_EQ(all.count, 9000);
  EXPECT_TRUE(at::allclose(all.mean, x.mean(0), 1e-13, 1e-15));
  EXPECT_TRUE(at::allclose(all.m2 / 9000.0, x.var(0, /*unbiased=*/false), 1e-12, 1e-15));
  EXPECT_TRUE(at::equal(all.min, std::get<0>(x.min(0))));
  EXPECT_TRUE(at::equal(all.max, std::get<0>(x.max(0))));
  for (int64_t cut : {1, 17, 4096, 5000, 8999}) {
    const FeatureStats m = merge_stats(of(r.slice(0, cut), 4), of(r.slice(cut, 9000), 4));
    EXPECT_EQ(m.count, 9000);
    EXPECT_TRUE(at::allclose(m.mean, all.mean, 1e-13, 1e-15)) << cut;
    EXPECT_TRUE(at::allclose(m.m2, all.m2, 1e-12, 1e-12)) << cut;
    EXPECT_TRUE(at::equal(m.min, all.min) && at::equal(m.max, all.max)) << cut;
    // The top-k does not depend on the split at all: the same values and the same rows.
    EXPECT_TRUE(at::equal(m.top_value, all.top_value)) << cut;
    EXPECT_TRUE(at::equal(m.top_seq, all.top_seq) && at::equal(m.top_pos, all.top_pos) &&
                at::equal(m.top_token, all.top_token))
        << cut;
  }
}

TEST(Stats, TopKIsTheLargestPerFeatureWithTiesToTheEarlierRow) {
  Rows r;
  r.x = at::tensor({1.0f, 5.0f, 3.0f, 5.0f, 5.0f, -2.0f}).view({6, 1});
  r.seq = at::tensor(std::vector<int64_t>{0, 0, 1, 1, 2, 2});
  r.pos = at::tensor(std::vector<int64_t>{0, 1, 0, 1, 0, 1});
  r.tok = at::tensor(std::vector<int64_t>{10, 11, 12, 13, 14, 15});
  for (int64_t cut : {0, 2, 4, 6}) {
    const FeatureStats s = merge_stats(of(r.slice(0, cut), 3), of(r.slice(cut, 6), 3));
    EXPECT_EQ(list<double>(s.top_value), (std::vector<double>{5, 5, 5}));
    EXPECT_EQ(list<int64_t>(s.top_token), (std::vector<int64_t>{11, 13, 14})) << cut;
  }
  // Three equal values for two places: the two earliest rows, whichever way topk would pick.
  for (int64_t cut : {0, 3, 6}) {
    const FeatureStats s = merge_stats(of(r.slice(0, cut), 2), of(r.slice(cut, 6), 2));
    EXPECT_EQ(list<int64_t>(s.top_token), (std::vector<int64_t>{11, 13})) << cut;
  }
  // Fewer rows than k: the rest is padding.
  const FeatureStats two = of(r.slice(0, 2), 4);
  EXPECT_EQ(list<int64_t>(two.top_token), (std::vector<int64_t>{11, 10, -1, -1}));
  EXPECT_TRUE(std::isinf(two.top_value[3][0].item<double>()));
}

TEST(Stats, TensorsRoundTripAndNoRowsIsEmpty) {
  const Rows r = rows(50, 3);
  const FeatureStats s = of(r, 2);
  std::vector<std::pair<std::string, at::Tensor>> t;
  stats_tensors("p", s, t);
  std::map<std::string, at::Tensor> by(t.begin(), t.end());
  const auto schema = stats_schema("p", {3}, 2);
  ASSERT_EQ(by.size(), schema.size());
  for (const auto& [name, want] : schema) {
    ASSERT_TRUE(by.count(name)) << name;
    EXPECT_EQ(by[name].sizes().vec(), want.row_shape) << name;
    EXPECT_FALSE(want.per_row);
  }
  const FeatureStats back = stats_from("p", 2, [&](const std::string& n) { return by.at(n); });
  EXPECT_EQ(back.count, 50);
  EXPECT_TRUE(at::equal(back.mean, s.mean) && at::equal(back.top_token, s.top_token));
  const FeatureStats none = of(r.slice(0, 0), 2);
  EXPECT_EQ(none.count, 0);
  EXPECT_TRUE(at::equal(merge_stats(none, s).mean, s.mean));
  EXPECT_TRUE(at::equal(merge_stats(s, none).top_value, s.top_value));
}
