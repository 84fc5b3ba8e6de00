// What the executor (src/executor/) needs of a Model beyond its public API. Defined in model.cpp,
// next to Model::Impl. Dependencies run executor -> models, never back: nothing under src/models/
// includes src/executor/ or src/dispatch/.
#pragma once

#include "actcap/model.h"
#include "models/module.h"

namespace actcap {

struct ModelParts {
  // lm_head multiplies by the embedding matrix itself (tied): its bytes are resident once when
  // both stages share a device.
  static bool head_shares_embedding(const Model& model);
  // Fills the architecture's per-forward tables (RoPE, masks) for st.seq positions on the device
  // of st.positions.
  static void prepare(const Model& model, ForwardState& st);
};

}  // namespace actcap
