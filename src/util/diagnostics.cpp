#include "actcap/diagnostics.h"

#include <iostream>
#include <mutex>

namespace actcap {

namespace {
std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
DiagnosticSink& sink() {
  static DiagnosticSink s;
  return s;
}
}  // namespace

void set_diagnostic_sink(DiagnosticSink s) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  sink() = std::move(s);
}

void warn(const std::string& message) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink())
    sink()(message);
  else
    std::cerr << ("actcap: warning: " + message + "\n");  // one insertion: one write, a whole line
}

}  // namespace actcap
