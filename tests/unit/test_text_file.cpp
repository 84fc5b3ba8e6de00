// Bounded reads: hostile sizes are clean InputErrors, never unbounded allocations.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "actcap/error.h"
#include "io/atomic_file.h"
#include "io/text_file.h"

using namespace actcap;

TEST(TextFile, ReadsWholeFileAndRefusesOversizedOnesBeforeReading) {
  char path[] = "/tmp/actcap-text-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "{\"a\": 1}\n", 9), 9);
  EXPECT_EQ(read_text_file(path, 9, "config.json"), "{\"a\": 1}\n");
  try {
    read_text_file(path, 8, "config.json");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("config.json is 9 bytes, over the limit of 8"),
              std::string::npos)
        << e.what();
  }
  // A sparse 1 TiB file: refused from its size alone (nothing is allocated or read).
  ASSERT_EQ(::ftruncate(fd, int64_t{1} << 40), 0);
  EXPECT_THROW(read_text_file(path, kMaxConfigBytes, "config.json"), InputError);
  ::close(fd);
  ::unlink(path);
  EXPECT_THROW(read_text_file("/nonexistent/config.json", 100, "config.json"), InputError);
  EXPECT_THROW(read_text_file("/tmp", 100, "config.json"), InputError);
}

TEST(TextFile, BoundedLines) {
  std::istringstream in("ab\n\ncdef\nlast");
  std::string line;
  std::vector<std::string> got;
  int64_t n = 0;
  while (read_line_bounded(in, line, 4, "in.txt", ++n)) got.push_back(line);
  EXPECT_EQ(got, (std::vector<std::string>{"ab", "", "cdef", "last"}));
  std::istringstream longer("ok\nabcdefgh\n");
  n = 0;
  EXPECT_TRUE(read_line_bounded(longer, line, 4, "in.txt", ++n));
  try {
    read_line_bounded(longer, line, 4, "in.txt", ++n);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("in.txt:2: line is longer than 4 bytes"),
              std::string::npos)
        << e.what();
  }
}

TEST(AtomicFile, ReplacesWholeAndLeavesNoTempFileEvenWhenItFails) {
  char dir[] = "/tmp/actcap-atomic-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/manifest.json";
  write_file_atomic(path, "first");
  write_file_atomic(path, "second, longer");
  EXPECT_EQ(read_text_file(path, 100, "test file"), "second, longer");
  EXPECT_EQ(temp_name_for(path, 3), path + ".tmp." + std::to_string(::getpid()) + "-3");
  EXPECT_FALSE(std::filesystem::exists(temp_name_for(path, 0)));
  EXPECT_EQ(temp_target(temp_name_for(path, 0)), path);
  EXPECT_EQ(temp_target("a.json.tmp.31813"), "a.json");  // as earlier versions named them
  EXPECT_EQ(temp_target("notes.tmp.txt"), "notes.tmp.txt");
  EXPECT_EQ(temp_target("a.tmp.12.tmp.34"), "a.tmp.12");
  for (const char* not_temp : {"a.tmp.12-", "a.tmp.-1", "a.tmp.1-2-3", "a.tmp.1-x", "a.tmp."})
    EXPECT_EQ(temp_target(not_temp), not_temp);
  // The target is a folder: rename fails, the error names the file, the temp file is gone.
  std::filesystem::create_directory(std::string(dir) + "/sub");
  try {
    write_file_atomic(std::string(dir) + "/sub", "x");
    FAIL() << "expected RunError";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("/sub"), std::string::npos) << e.what();
  }
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // manifest.json only
  std::filesystem::remove_all(dir);
}

// A leftover temp file can be a hard link to the live file (remove_if_same killed between its
// link() and its unlink() leaves one, under a name a later process of the same pid tries first).
// A write never opens an existing temp name, so the live file's bytes are never written through:
// not while the write runs, not when it fails.
TEST(AtomicFile, ALeftoverTempLinkedToTheFileIsNeverWrittenThrough) {
  char dir[] = "/tmp/actcap-atomic-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/manifest.json";
  write_file_atomic(path, "the live manifest");
  for (unsigned n : {0u, 1u}) ASSERT_EQ(::link(path.c_str(), temp_name_for(path, n).c_str()), 0);
  try {
    write_file_atomic(path, [&](int fd) {
      write_all(fd, "x", 1, path);
      EXPECT_EQ(read_text_file(path, 100, "test file"), "the live manifest");  // mid-write
      throw RunError("the disk is full");
    });
    FAIL() << "expected RunError";
  } catch (const RunError& e) {
    EXPECT_STREQ(e.what(), "the disk is full");
  }
  EXPECT_EQ(read_text_file(path, 100, "test file"), "the live manifest");
  write_file_atomic(path, "a newer manifest");
  EXPECT_EQ(read_text_file(path, 100, "test file"), "a newer manifest");
  for (unsigned n : {0u, 1u})  // the leftovers are left as they were
    EXPECT_EQ(read_text_file(temp_name_for(path, n), 100, "test file"), "the live manifest");
  EXPECT_FALSE(std::filesystem::exists(temp_name_for(path, 2)));  // the write's own temp: gone
  std::filesystem::remove_all(dir);
}
