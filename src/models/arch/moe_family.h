// What the Llama-style mixture-of-experts decoders share (Mixtral, Qwen3-MoE, OLMoE): the expert
// fields (MoeParams), reading them, the presets, a layer's SparseMoe from the checkpoint's weights
// and the model around it. Each architecture's file names its weights and defaults.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "models/arch/llama_family.h"
#include "models/parts/moe.h"

namespace actcap {

struct MoeParams : LlamaParams {
  int64_t num_experts = 8;            // Mixtral's num_local_experts, Qwen3-MoE's num_experts
  int64_t top_k = 2;                  // num_experts_per_tok
  int64_t moe_intermediate_size = 0;  // each expert's inner width (Mixtral: intermediate_size)
  bool norm_topk_prob = true;         // renormalise the k routing weights to sum 1
  // Qwen3-MoE: layer i is sparse unless listed in mlp_only_layers or (i + 1) is not a multiple of
  // decoder_sparse_step; the others run a dense MLP of intermediate_size.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  // DeepSeek-V3: the layers below this one are dense.
  int64_t first_k_dense_replace = 0;
  // Qwen2-MoE's shared expert, DeepSeek-V3's shared experts: each sparse block also runs a gated
  // MLP this wide on every token (0: none).
  int64_t shared_expert_intermediate_size = 0;

  bool sparse(int64_t layer) const;
  std::unique_ptr<ArchParams> clone() const override { return std::make_unique<MoeParams>(*this); }
};

// How an architecture's checkpoint names a sparse block's weights, relative to the layer.
struct MoeNames {
  std::string block;                      // "block_sparse_moe" (Mixtral) or "mlp"
  std::string gate, up, down;             // each expert's: "w1", "w3", "w2" or "gate_proj", ...
  bool weights_in_compute_dtype = false;  // see SparseMoeOptions
};

// Where a layer's sparse block keeps its weights: `mlp` when the experts are stacked as
// transformers 5 holds them (`mlp.experts.gate_up_proj`), else names.block.
WeightSource moe_block(WeightSource layer, const MoeNames& names);
// The experts' matrices under `block`: stacked (experts.gate_up_proj [E, 2I, H], each expert's
// gate rows then its up rows, and experts.down_proj [E, H, I]; views of those) or one tensor each
// (experts.E.<names.gate>.weight ...).
std::vector<ExpertWeights> expert_weights(const ModelConfig& c, WeightSource block,
                                          const MoeNames& names);

// Layer `layer`'s sparse block: the module is named `<layer>.mlp` (transformers 5's name for both
// architectures; transformers 4 called Mixtral's `block_sparse_moe`), its router
// `<layer>.mlp.gate`, with p.shared_expert_intermediate_size its shared expert
// `<layer>.mlp.shared_expert` and `<layer>.mlp.shared_expert_gate`. Weights per expert under
// `names`, or stacked as transformers 5 holds them in memory (`mlp.experts.gate_up_proj`,
// `mlp.experts.down_proj`) when the checkpoint has those.
std::unique_ptr<Module> build_sparse_moe(const ModelConfig& c, WeightSource layer,
                                         const MoeNames& names);

// The Llama family's model with each layer's MLP as p.sparse() says: the sparse block (weights as
// `names` says) or the dense gated MLP under `mlp`; when `b.layer` is set, it builds whole layers
// instead (OLMoE's), when `b.mlp` is, that builds each layer's MLP (DeepSeek-V3's). The planner's
// MLP width covers both kinds.
BuiltModel build_moe_family(const ModelConfig& c, WeightSource& w, const MoeNames& names,
                            LlamaBuild b = {});

// The shared presets (tiny, small, gpt2-small) with MoE params: the family's sizes, `experts`
// experts choosing `top_k`, each `inner` wide.
ModelConfig moe_preset(const std::string& arch, const std::string& preset, int64_t experts,
                       int64_t top_k, int64_t inner);

// The Qwen MoEs' expert fields after the counts: moe_intermediate_size (absent:
// `inner_default`), norm_topk_prob (false), decoder_sparse_step (1) and mlp_only_layers (a list of
// layer indices; absent or null: none); and writing them with the counts.
void parse_qwen_moe_fields(const ConfigReader& f, int64_t inner_default, MoeParams& p);
void write_qwen_moe_fields(const MoeParams& p, nlohmann::json& j);

// Reads num_experts_per_tok and the expert count, under the first of `experts_keys` config.json
// has. Which wins where a file has both names is each config class's: usually the attribute_map
// alias (Mixtral's and gpt-oss's num_experts, OLMoE's and DeepSeek-V3's num_local_experts), but
// Qwen3-MoE keeps num_local_experts (transformers 5.12).
void parse_expert_counts(const ConfigReader& f, std::initializer_list<const char*> experts_keys,
                         int64_t experts_default, int64_t top_k_default, MoeParams& p);

}  // namespace actcap
