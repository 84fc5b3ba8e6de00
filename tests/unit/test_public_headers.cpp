// The public API compiles without nlohmann/json.hpp: public headers include only
// nlohmann/json_fwd.hpp, so an embedder neither pays for nor depends on the full JSON header.
// This file is compiled without the precompiled header (CMakeLists.txt), which includes it.
#include "actcap/actcap.h"

#ifdef INCLUDE_NLOHMANN_JSON_HPP_
#error "a public header includes nlohmann/json.hpp; include nlohmann/json_fwd.hpp instead"
#endif

#include <gtest/gtest.h>

TEST(PublicHeaders, UmbrellaHeaderDoesNotIncludeJson) {
  actcap::DeviceMap map{{"", "cpu:0"}};  // a device map is a plain C++ map
  EXPECT_EQ(map.size(), 1u);
}
