// util/torch_compat.h: the one version difference, both branches checked here with stand-ins (the
// LibTorch this builds against takes only one of them).
#include <gtest/gtest.h>

#include "util/torch_compat.h"

using namespace actcap;

namespace {

struct WithSynchronize {  // as c10::Event from LibTorch 2.x
  mutable int synchronized = 0, queried = 0;
  void synchronize() const { ++synchronized; }
  bool query() const { return ++queried > 3; }
};

struct QueryOnly {  // as c10::Event in LibTorch 1.13
  mutable int queried = 0;
  bool query() const { return ++queried > 100; }
};

}  // namespace

TEST(TorchCompat, AnEventWithSynchronizeIsWaitedOnByIt) {
  WithSynchronize e;
  compat::synchronize_event(e);
  EXPECT_EQ(e.synchronized, 1);
  EXPECT_EQ(e.queried, 0);
}

TEST(TorchCompat, AnEventWithoutSynchronizeIsPolledUntilComplete) {
  QueryOnly e;
  compat::synchronize_event(e);
  EXPECT_EQ(e.queried, 101);
}
