#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "actcap/hash.h"

using namespace actcap;

// The snapshot fingerprint: a parallel copy that hashes each 64 KiB chunk as it goes must give the
// same bytes and the same value as hashing afterwards, at every size around the chunk boundaries,
// and must change when any single byte does.
TEST(Hash, CopyChunkedCopiesAndFingerprintsLikeHashingAfterwards) {
  std::mt19937 rng(7);
  const size_t k = size_t{64} << 10;
  for (size_t size : {size_t{0}, size_t{1}, size_t{31}, k - 1, k, k + 1, 5 * k + 17, 40 * k + 3}) {
    std::vector<unsigned char> src(size), dst(size, 0xAA);
    for (auto& b : src) b = static_cast<unsigned char>(rng());
    const uint64_t fp = copy_chunked(src.data(), dst.data(), size, /*fingerprint=*/true);
    EXPECT_EQ(src, dst) << size;
    EXPECT_EQ(fp, chunked_xxh3(src.data(), size)) << size;
    EXPECT_EQ(copy_chunked(src.data(), dst.data(), size, /*fingerprint=*/false), 0u);
    for (size_t at : {size_t{0}, size / 2, size - 1}) {
      if (size == 0) break;
      dst[at] ^= 0x10;
      EXPECT_NE(chunked_xxh3(dst.data(), size), fp) << size << " byte " << at;
      dst[at] ^= 0x10;
    }
  }
  EXPECT_NE(chunked_xxh3("ab", 2), chunked_xxh3("ba", 2));
}
