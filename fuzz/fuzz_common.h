// Shared helpers for the fuzz targets.
//
// The contract every target checks: parsers either succeed or throw actcap::Error (InputError /
// RunError). Only actcap::Error is caught. Any other exception escapes LLVMFuzzerTestOneInput, so
// std::terminate runs at the throw site (its stack is in the report) and libFuzzer records a crash.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "actcap/error.h"

// An invariant of the library that must hold for every input: prints and aborts (a crash).
#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "\nFUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                       \
      std::fprintf(stderr, "\n");                                                              \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)

namespace fuzz {

// Runs f; swallows the expected actcap::Error and reports whether f succeeded.
template <typename F>
bool clean(F&& f) {
  try {
    f();
    return true;
  } catch (const actcap::Error&) {
    return false;
  }
}

// Splits on `sep`, keeping empty fields.
inline std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == sep) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  return out;
}

// A private folder for the files a target writes, one per process, removed when the process
// exits normally (libFuzzer's -runs / -max_total_time end with exit()); a crash leaves it for
// the report.
inline const std::string& scratch_dir() {
  namespace fs = std::filesystem;
  static const std::string dir =
      (fs::temp_directory_path() / ("actcap-fuzz-" + std::to_string(::getpid()))).string();
  // Registered after `dir` is built, so it runs before `dir` is destroyed.
  static const bool made = [] {
    fs::create_directories(dir);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(dir, ec);
    });
    return true;
  }();
  (void)made;
  return dir;
}

// Printable rendering of bytes for FUZZ_CHECK messages.
inline std::string escape(const std::string& s, size_t limit = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > limit) out += "...";
  return out;
}

}  // namespace fuzz
