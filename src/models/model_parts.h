// What the executor (src/executor/) needs of a Model beyond its public API. Defined in model.cpp,
// next to Model::Impl. Dependencies run executor -> models, never back: nothing under src/models/
// includes src/executor/ or src/dispatch/.
#pragma once

#include <cstdint>
#include <map>

#include "actcap/model.h"
#include "models/module.h"

namespace actcap {

struct ModelParts {
  // lm_head multiplies by the embedding matrix itself (tied): its bytes are resident once when
  // both stages share a device.
  static bool head_shares_embedding(const Model& model);
  // The observers attached now, by handle id (attach order). Detaching erases an entry, so a
  // caller that may detach while iterating copies the entries and looks each id up before use.
  static const std::map<int64_t, Observer*>& observers(const Model& model);
};

}  // namespace actcap
