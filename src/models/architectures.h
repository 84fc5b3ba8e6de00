// One builder per architecture (gpt2.cpp, llama.cpp). Each turns float32 weights in canonical HF
// names into the top-level modules a device map places, in execution order.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actcap/config.h"
#include "actcap/error.h"
#include "actcap/model.h"
#include "models/module.h"

namespace actcap {

struct BuiltStage {
  StageKind kind;
  std::unique_ptr<Module> module;
};

struct BuiltModel {
  std::vector<BuiltStage> stages;  // embeddings, blocks..., final norm, lm_head
  // lm_head multiplies by the embedding matrix itself (tied): its bytes are resident once when
  // both stages share a device.
  bool head_shares_embedding = false;
  // Fills the per-forward tables this architecture needs (RoPE, masks) for st.seq positions.
  std::function<void(ForwardState&)> prepare;
};

BuiltModel build_gpt2(const Gpt2Config& c, const std::map<std::string, at::Tensor>& w);
BuiltModel build_llama(const LlamaConfig& c, const std::map<std::string, at::Tensor>& w);

}  // namespace actcap
