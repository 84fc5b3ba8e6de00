// Hook points: every Hugging Face module name, as its output (`NAME`) and its first input
// (`NAME:input`); each attention module also has its pre-softmax scores (`NAME:scores`) and
// post-softmax probabilities (`NAME:probs`), [heads, keys] per query token (docs/hook-points.md).
// Patterns: `*` matches one dot-separated segment, `**` any number of segments.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace actcap {

// What a hook is told about the call it observes.
struct HookContext {
  const std::string& point;  // full point name, e.g. "transformer.h.3.mlp" or "...:input"
  bool is_input;             // true for `NAME:input` points (pre-hooks)
  c10::Device device;        // device the tensor lives on
  int64_t call_index;  // 0, 1, 2, ... per hook and point, counting every call since registration
  int64_t step;        // index of the forward() call on the model
};

// A hook observes a tensor it does NOT own.
//   `borrowed` is valid only until the hook returns: the engine reuses its memory for later
//   layers. Copy (clone) what you keep; a kept handle, view or detach() aliases reused memory.
//   Do not modify it.
using HookFn = std::function<void(const HookContext& ctx, const at::Tensor& borrowed)>;

// What the engine does when a hook returns still holding the borrowed tensor (its TensorImpl or a
// view/detach() sharing its storage): the memory is reused by later layers, so the kept value
// would silently change.
enum class BareRefPolicy { kError, kWarn, kOff };
BareRefPolicy parse_bare_ref_policy(const std::string& text);  // error | warn | off

// Per-token description of a hook point: the tensor at the point has shape [batch, seq, ...shape].
struct PointInfo {
  std::string name;
  std::vector<int64_t> shape;
  c10::ScalarType dtype;
};

// True when `name` matches `pattern` (segments split on '.', `*` one segment, `**` zero or more;
// a `:input`, `:scores` or `:probs` suffix must be the same on both or on neither; `*` inside a
// segment is a glob).
bool match_point(const std::string& pattern, const std::string& name);
// The names closest to `pattern` by edit distance, at most `n`, for error messages.
std::vector<std::string> nearest_points(const std::string& pattern,
                                        const std::vector<std::string>& names, size_t n = 5);

}  // namespace actcap
