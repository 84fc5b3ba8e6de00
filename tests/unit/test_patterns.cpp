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
  auto near = actcap::nearest_points("transformer.h.0.mpl", {"lm_head", "transformer.h.0.mlp", "transformer.wte"}, 2);
  ASSERT_EQ(near.size(), 2u);
  EXPECT_EQ(near[0], "transformer.h.0.mlp");
}
