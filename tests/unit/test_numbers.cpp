#include <gtest/gtest.h>

#include <limits>

#include "actcap/numbers.h"

using actcap::parse_int64;

TEST(Numbers, WholeDecimalIntegersOnly) {
  EXPECT_EQ(parse_int64("0"), 0);
  EXPECT_EQ(parse_int64("42"), 42);
  EXPECT_EQ(parse_int64("+42"), 42);
  EXPECT_EQ(parse_int64("-4"), -4);
  EXPECT_EQ(parse_int64("9223372036854775807"), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse_int64("-9223372036854775808"), std::numeric_limits<int64_t>::min());
  for (const char* bad :
       {"", "+", "-", "+-4", "-+4", "++4", "--4", " 4", "4 ", "4a", "0x10", "1e3", "4.0",
        "9223372036854775808", "-9223372036854775809", "99999999999999999999999"})
    EXPECT_FALSE(parse_int64(bad).has_value()) << "'" << bad << "'";
  EXPECT_FALSE(parse_int64(std::string_view("4\0"
                                            "5",
                                            3))
                   .has_value());  // an embedded NUL is not a digit
}
