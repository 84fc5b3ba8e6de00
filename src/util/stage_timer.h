// Wall-clock totals per named stage of the extract pipeline, for profiling only: on when the
// environment sets ACTCAP_PROFILE (to anything but 0), printed to stderr at exit as
// "actcap profile: NAME total_s calls", one line per stage. Off, a timer costs one load of a
// static flag.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace actcap {

class StageTotals {
 public:
  static StageTotals& get() {
    static StageTotals t;
    return t;
  }
  bool on() const { return on_; }
  void add(const char* name, double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& [total, calls] = totals_[name];
    total += seconds;
    ++calls;
  }
  ~StageTotals() {
    for (const auto& [name, v] : totals_)
      std::fprintf(stderr, "actcap profile: %-28s %9.3f s %6lld\n", name.c_str(), v.first,
                   static_cast<long long>(v.second));
  }

 private:
  StageTotals() {
    const char* e = std::getenv("ACTCAP_PROFILE");
    on_ = e && *e && std::string(e) != "0";
  }
  bool on_ = false;
  std::mutex mu_;
  std::map<std::string, std::pair<double, long long>> totals_;
};

// Adds the time from construction to destruction to `name`'s total (when profiling is on).
class StageTimer {
 public:
  explicit StageTimer(const char* name)
      : name_(StageTotals::get().on() ? name : nullptr),
        t0_(name_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{}) {}
  ~StageTimer() { stop(); }
  void stop() {
    if (!name_) return;
    StageTotals::get().add(
        name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    name_ = nullptr;
  }
  StageTimer(const StageTimer&) = delete;
  StageTimer& operator=(const StageTimer&) = delete;

 private:
  const char* name_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace actcap
