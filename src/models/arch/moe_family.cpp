#include "models/arch/moe_family.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "models/config_reader.h"
#include "models/parts/moe.h"

namespace actcap {

bool MoeParams::sparse(int64_t layer) const {
  if (num_experts <= 0 || layer < first_k_dense_replace) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end())
    return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

void parse_expert_counts(const ConfigReader& f, std::initializer_list<const char*> experts_keys,
                         int64_t experts_default, int64_t top_k_default, MoeParams& p) {
  const char* experts_key = *experts_keys.begin();
  for (const char* k : experts_keys)
    if (f.has(k)) {
      experts_key = k;
      break;
    }
  // Zero experts is a dense model (Qwen3-MoE's num_experts=0); the sizes beyond that are checked.
  p.num_experts = f.integer({experts_key}, experts_default);
  if (p.num_experts < 0 || p.num_experts >= (int64_t{1} << 20))
    throw InputError(concat(f.origin(), ": field '", experts_key,
                            "' must be between 0 and 2^20, got ", p.num_experts));
  p.top_k = f.positive({"num_experts_per_tok"}, top_k_default);
  if (p.num_experts > 0 && p.top_k > p.num_experts)
    throw InputError(concat(f.origin(), ": num_experts_per_tok=", p.top_k, " exceeds ", experts_key,
                            "=", p.num_experts,
                            "; a token cannot choose more experts than there are"));
}

void parse_qwen_moe_fields(const ConfigReader& f, int64_t inner_default, MoeParams& p) {
  p.moe_intermediate_size = f.positive({"moe_intermediate_size"}, inner_default);
  p.norm_topk_prob = f.boolean({"norm_topk_prob"}, false);
  p.decoder_sparse_step = f.positive({"decoder_sparse_step"}, 1);
  const nlohmann::json* only = f.find({"mlp_only_layers"});
  if (!only) return;
  if (!only->is_array())
    throw InputError(
        concat(f.origin(), ": field 'mlp_only_layers' must be a list of layer indices"));
  // Entries that are no layer (a model cut to fewer layers) name nothing, as in transformers.
  for (const nlohmann::json& v : *only) {
    if (!v.is_number_integer())
      throw InputError(concat(f.origin(), ": field 'mlp_only_layers' holds ", v.dump(),
                              "; each entry must be a layer index"));
    p.mlp_only_layers.push_back(v.get<int64_t>());
  }
}

void write_qwen_moe_fields(const MoeParams& p, nlohmann::json& j) {
  j["num_experts"] = p.num_experts;
  j["num_experts_per_tok"] = p.top_k;
  j["moe_intermediate_size"] = p.moe_intermediate_size;
  j["norm_topk_prob"] = p.norm_topk_prob;
  j["decoder_sparse_step"] = p.decoder_sparse_step;
  j["mlp_only_layers"] = p.mlp_only_layers;
}

ModelConfig moe_preset(const std::string& arch, const std::string& preset, int64_t experts,
                       int64_t top_k, int64_t inner) {
  ModelConfig c = llama_family_preset(arch, preset);
  auto p = std::make_unique<MoeParams>();
  static_cast<LlamaParams&>(*p) = c.params<LlamaParams>();
  p->num_experts = experts;
  p->top_k = top_k;
  p->moe_intermediate_size = inner;
  c.arch_params = std::move(p);
  return c;
}

WeightSource moe_block(WeightSource layer, const MoeNames& names) {
  // transformers 5's own layout (save_pretrained(save_original_format=False), or a save with an
  // adapter loaded): the block under `mlp` with the experts stacked.
  WeightSource fused = layer.pp("mlp");
  return fused.has("experts.gate_up_proj") ? fused : layer.pp(names.block);
}

std::vector<ExpertWeights> expert_weights(const ModelConfig& c, WeightSource block,
                                          const MoeNames& names) {
  const auto& p = c.params<MoeParams>();
  const int64_t H = c.hidden_size, I = p.moe_intermediate_size, E = p.num_experts;
  std::vector<ExpertWeights> experts;
  experts.reserve(static_cast<size_t>(E));
  if (block.has("experts.gate_up_proj")) {
    // gate_up_proj [E, 2I, H] (each expert's gate rows, then its up rows) and down_proj [E, H, I];
    // each expert's matrices are views of those.
    at::Tensor gate_up = block.get("experts.gate_up_proj", {E, 2 * I, H});
    at::Tensor down = block.get("experts.down_proj", {E, H, I});
    for (int64_t e = 0; e < E; ++e)
      experts.push_back({gate_up[e].narrow(0, 0, I), gate_up[e].narrow(0, I, I), down[e]});
    return experts;
  }
  for (int64_t e = 0; e < E; ++e) {
    WeightSource x = block.pp("experts").pp(e);
    experts.push_back({x.pp(names.gate).get_linear("weight", {I, H}),
                       x.pp(names.up).get_linear("weight", {I, H}),
                       x.pp(names.down).get_linear("weight", {H, I})});
  }
  return experts;
}

std::unique_ptr<Module> build_sparse_moe(const ModelConfig& c, WeightSource layer,
                                         const MoeNames& names) {
  const auto& p = c.params<MoeParams>();
  const int64_t H = c.hidden_size, E = p.num_experts;
  const std::string name = layer.path() + ".mlp";
  WeightSource block = moe_block(layer, names);
  auto router = std::make_unique<Linear>(name + ".gate", block.pp("gate").get("weight", {E, H}),
                                         at::Tensor());
  std::vector<ExpertWeights> experts = expert_weights(c, block, names);
  SparseMoeOptions o;
  o.top_k = p.top_k;
  o.normalize_top_k = p.norm_topk_prob;
  o.weights_in_compute_dtype = names.weights_in_compute_dtype;
  SharedExpert shared;
  if (p.shared_expert_intermediate_size > 0) {
    shared.mlp = llama_gated_mlp(c, block.pp("shared_expert"), p.hidden_act,
                                 p.shared_expert_intermediate_size);
    shared.gate = linear_layer(block, "shared_expert_gate", H, 1, /*bias=*/false);
  }
  return std::make_unique<SparseMoe>(name, H, std::move(router), std::move(experts), p.hidden_act,
                                     o, std::move(shared));
}

BuiltModel build_moe_family(const ModelConfig& c, WeightSource& w, const MoeNames& names,
                            LlamaBuild b) {
  const auto& p = c.params<MoeParams>();
  if (!b.layer && !b.mlp)
    b.mlp = [&names](const ModelConfig& c, WeightSource layer, int64_t i) {
      const auto& p = c.params<MoeParams>();
      return p.sparse(i) ? build_sparse_moe(c, layer, names)
                         : llama_gated_mlp(c, layer.pp("mlp"), p.hidden_act);
    };
  BuiltModel m = build_llama_family(c, w, b);
  m.mlp_width = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    m.mlp_width = std::max(m.mlp_width,
                           p.sparse(i) ? SparseMoe::width_per_token(
                                             c.hidden_size, p.moe_intermediate_size, p.num_experts,
                                             p.top_k, p.shared_expert_intermediate_size)
                                       : p.intermediate_size);
  return m;
}

}  // namespace actcap
