// What the executor (src/executor/) needs of a Model beyond its public API. Defined in model.cpp,
// next to Model::Impl. Dependencies run executor -> models, never back: nothing under src/models/
// includes src/executor/ or src/dispatch/.
#pragma once

#include <cstdint>
#include <map>

#include "actcap/model.h"
#include "models/module.h"

namespace actcap {

struct KvCache;

// One forward of a generation (src/generate/): the cache its attention modules use, and the
// position of each row's tokens ([B, T] int64 on the host; undefined for the prompt pass, whose
// positions are 0..T-1).
struct CachedStep {
  KvCache* kv = nullptr;
  at::Tensor positions;
};

struct ModelParts {
  // lm_head multiplies by the embedding matrix itself (tied): its bytes are resident once when
  // both stages share a device.
  static bool head_shares_embedding(const Model& model);
  // The observers attached now, by handle id (attach order). Detaching erases an entry, so a
  // caller that may detach while iterating copies the entries and looks each id up before use.
  static const std::map<int64_t, Observer*>& observers(const Model& model);
  // Model::forward with a KV cache (defined in src/executor/executor.cpp).
  static at::Tensor forward_cached(Model& model, const Batch& batch, Model::Logits logits,
                                   const CachedStep& step);
  // Keys and values the stages cache per token and sequence, in elements (per stage).
  static std::vector<int64_t> kv_elements_per_token(const Model& model);
};

}  // namespace actcap
