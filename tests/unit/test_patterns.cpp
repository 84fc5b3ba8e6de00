#include <gtest/gtest.h>

#include "actcap/hooks.h"

using actcap::match_point;

TEST(Patterns, ExactAndSingleSegment) {
  EXPECT_TRUE(match_point("transformer.h.3", "transformer.h.3"));
  EXPECT_FALSE(match_point("transformer.h.3", "transformer.h.30"));
  EXPECT_TRUE(match_point("transformer.h.*", "transformer.h.11"));
  EXPECT_FALSE(match_point("transformer.h.*", "transformer.h.11.mlp"));
  EXPECT_TRUE(match_point("transformer.h.*.mlp", "transformer.h.0.mlp"));
}

TEST(Patterns, AnyDepth) {
  EXPECT_TRUE(match_point("**", "lm_head"));
  EXPECT_TRUE(match_point("**", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(match_point("model.**.q_proj", "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(match_point("model.layers.**", "model.layers.3"));
  EXPECT_FALSE(match_point("model.layers.**.mlp", "model.layers.3.self_attn"));
}

TEST(Patterns, InputSuffixMustAgree) {
  EXPECT_FALSE(match_point("**", "transformer.h.0:input"));
  EXPECT_TRUE(match_point("**:input", "transformer.h.0:input"));
  EXPECT_FALSE(match_point("**:input", "transformer.h.0"));
  EXPECT_TRUE(match_point("transformer.h.*:input", "transformer.h.2:input"));
}

TEST(Patterns, GlobInsideSegment) {
  EXPECT_TRUE(match_point("model.layers.*.self_attn.*_proj", "model.layers.1.self_attn.k_proj"));
  EXPECT_FALSE(match_point("model.layers.*.self_attn.*_proj", "model.layers.1.self_attn"));
}

TEST(Patterns, NearestNames) {
  auto near = actcap::nearest_points("transformer.h.0.mpl",
                                     {"lm_head", "transformer.h.0.mlp", "transformer.wte"}, 2);
  ASSERT_EQ(near.size(), 2u);
  EXPECT_EQ(near[0], "transformer.h.0.mlp");
}

// fuzz/regressions/fuzz_small_parsers/match_point_exponential_doublestar.txt: many "**" used to
// backtrack exponentially (121 bytes took > 10 s). Now a table over segments: instant.
TEST(Patterns, ManyDoubleStarsAreFast) {
  std::string p;
  for (int i = 0; i < 60; ++i) p += "**.";
  p += "x";
  std::string name;
  for (int i = 0; i < 40; ++i) name += "a.";
  name += "y";
  EXPECT_FALSE(match_point(p, name));
  name.back() = 'x';
  EXPECT_TRUE(match_point(p, name));
  EXPECT_TRUE(match_point("**.**.**", "a"));
  EXPECT_TRUE(match_point("a.**.**.b", "a.b"));
  EXPECT_FALSE(match_point("a.**.c.**.b", "a.b"));
  EXPECT_TRUE(match_point("a.**.c.**.b", "a.x.c.y.z.b"));
  // Many stars within one segment: linear, not exponential.
  EXPECT_FALSE(match_point(std::string(200, '*') + "b", std::string(300, 'a')));
  EXPECT_TRUE(match_point("*a*b*c*", "xxaxxbxxcxx"));
  EXPECT_FALSE(match_point("*a*b*c*", "xxaxxcxxbxx"));
  EXPECT_TRUE(match_point("a*", "a"));
  EXPECT_FALSE(match_point("", "a"));
}

// fuzz/regressions/fuzz_small_parsers/match_point_nul_in_pattern.txt: a NUL inside a pattern is a
// character like any other, not the end of the pattern.
TEST(Patterns, EmbeddedNulIsNotTheEnd) {
  EXPECT_FALSE(match_point(std::string("lm_head\0", 8), "lm_head"));
  EXPECT_FALSE(match_point(std::string("lm_\0*", 5), "lm_head"));
}
