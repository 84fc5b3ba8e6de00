// Warnings the library raises while it keeps going: a hook that kept a borrowed tensor under the
// `warn` bare-reference policy, checkpoint tensors the model does not use. They go to one sink,
// which the embedding program chooses; until it does, each is written to stderr as one line
// "actcap: warning: <message>".
#pragma once

#include <functional>
#include <string>

namespace actcap {

using DiagnosticSink = std::function<void(const std::string& message)>;

// Replaces the process-wide sink (an empty function restores the stderr default). Thread-safe;
// the sink itself may be called from any thread that runs the model.
void set_diagnostic_sink(DiagnosticSink sink);
// Hands one warning to the sink.
void warn(const std::string& message);

}  // namespace actcap
