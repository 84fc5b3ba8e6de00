// The registry: every architecture actcap runs, one line each.
#include <cmath>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "models/arch/architecture.h"
#include "models/config_reader.h"
#include "models/module.h"
#include "models/parts/mlp.h"
#include "models/parts/norm.h"
#include "util/strings.h"

namespace actcap {

const Architecture& gpt2_architecture();
const Architecture& llama_architecture();
const Architecture& mistral_architecture();
const Architecture& qwen2_architecture();
const Architecture& qwen3_architecture();
const Architecture& smollm3_architecture();
const Architecture& olmo_architecture();
const Architecture& olmo2_architecture();
const Architecture& olmo3_architecture();
const Architecture& gemma_architecture();
const Architecture& gemma2_architecture();
const Architecture& gemma3_architecture();
const Architecture& gpt_neox_architecture();
const Architecture& gptj_architecture();
const Architecture& gpt_neo_architecture();
const Architecture& opt_architecture();
const Architecture& phi_architecture();
const Architecture& phi3_architecture();
const Architecture& mixtral_architecture();
const Architecture& qwen2_moe_architecture();
const Architecture& qwen3_moe_architecture();
const Architecture& olmoe_architecture();
const Architecture& gpt_oss_architecture();
const Architecture& deepseek_v2_architecture();
const Architecture& deepseek_v3_architecture();

const std::vector<const Architecture*>& architectures() {
  static const std::vector<const Architecture*> all = {
      &gpt2_architecture(),        &llama_architecture(),     &mistral_architecture(),
      &qwen2_architecture(),       &qwen3_architecture(),     &smollm3_architecture(),
      &olmo_architecture(),        &olmo2_architecture(),     &olmo3_architecture(),
      &gemma_architecture(),       &gemma2_architecture(),    &gemma3_architecture(),
      &gpt_neox_architecture(),    &gptj_architecture(),      &gpt_neo_architecture(),
      &opt_architecture(),         &phi_architecture(),       &phi3_architecture(),
      &mixtral_architecture(),     &qwen2_moe_architecture(), &qwen3_moe_architecture(),
      &olmoe_architecture(),       &gpt_oss_architecture(),   &deepseek_v2_architecture(),
      &deepseek_v3_architecture(),
  };
  return all;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> out;
  for (const Architecture* a : architectures())
    for (const std::string& t : a->model_types()) out.push_back(t);
  return out;
}

const Architecture& architecture_for(const std::string& model_type, const char* origin) {
  for (const Architecture* a : architectures())
    for (const std::string& t : a->model_types())
      if (t == model_type) return *a;
  throw InputError(concat(origin, ": unsupported model_type '", model_type,
                          "'; supported: ", join(supported_model_types(), ", ")));
}

const Architecture& architecture_of(const ModelConfig& c) {
  for (const Architecture* a : architectures())
    if (a->name() == c.arch) return *a;
  throw InputError(concat("unknown architecture '", c.arch,
                          "'; supported: ", join(supported_model_types(), ", ")));
}

std::unique_ptr<Linear> linear_layer(WeightSource w, const std::string& name, int64_t in,
                                     int64_t out, bool bias) {
  WeightSource v = w.pp(name);
  return std::make_unique<Linear>(v.path(), v.get_linear("weight", {out, in}),
                                  bias ? v.get("bias", {out}, Init::kBias) : at::Tensor());
}

int64_t rope_max_positions(const RopeConfig& r, int64_t max_position_embeddings) {
  if (r.rope_type != "dynamic") return max_position_embeddings;
  const double n = std::floor(r.factor * static_cast<double>(max_position_embeddings));
  return n >= 2147483647.0 ? int64_t{2147483647} : static_cast<int64_t>(n);
}

double partial_rotary_fraction(const ConfigReader& f, const char* top_level, double dflt) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const nlohmann::json* d = f.find({key});
    if (!d || !d->is_object() || d->empty()) continue;
    const ConfigReader s(*d, concat(f.origin(), " (", key, ")"));
    if (s.has("partial_rotary_factor")) return s.number({"partial_rotary_factor"}, dflt);
  }
  return f.number({top_level}, dflt);
}

std::unique_ptr<Module> layer_norm(WeightSource w, const std::string& name, int64_t width,
                                   double eps) {
  WeightSource v = w.pp(name);
  return std::make_unique<LayerNorm>(v.path(), v.get("weight", {width}, Init::kGain),
                                     v.get("bias", {width}, Init::kBias), eps);
}

std::unique_ptr<Module> biased_mlp(WeightSource w, const char* up, const char* act,
                                   const char* down, const std::string& activation, int64_t hidden,
                                   int64_t inner) {
  auto fc = linear_layer(w, up, hidden, inner, true);
  auto a = std::make_unique<Activation>(concat(w.path(), ".", act), activation, inner);
  return std::make_unique<Mlp>(w.path(), hidden, std::move(fc), std::move(a),
                               linear_layer(w, down, inner, hidden, true));
}

namespace {

// wte(ids) + wpe(positions); HF has no module for the sum (transformer.drop is identity in eval).
class LearnedPositionEmbeddings : public Module {
 public:
  LearnedPositionEmbeddings(at::Tensor wte, at::Tensor wpe)
      : Module("", ids_point(""), hidden_point("", wte.size(1))) {
    wte_ = add(std::make_unique<Embedding>("transformer.wte", std::move(wte)));
    wpe_ = add(std::make_unique<Embedding>("transformer.wpe", std::move(wpe)));
  }

 protected:
  at::Tensor forward(const at::Tensor& ids, ForwardState& st) override {
    auto tok = wte_->call(ids, st);
    auto pos = wpe_->call(st.row_positions.defined()
                              ? st.row_positions
                              : st.positions.unsqueeze(0).expand({st.batch, st.seq}),
                          st);
    return tok + pos;
  }

 private:
  Embedding* wte_;
  Embedding* wpe_;
};

}  // namespace

std::unique_ptr<Module> learned_position_embeddings(const ModelConfig& c, WeightSource& t,
                                                    at::Tensor& wte) {
  std::vector<std::string> tied;
  if (c.tie_word_embeddings) tied.push_back("lm_head.weight");
  wte = t.get("wte.weight", {c.vocab_size, c.hidden_size}, Init::kMatrix, Layout::kAsStored, tied);
  at::Tensor wpe = t.get("wpe.weight", {c.max_position_embeddings, c.hidden_size});
  return std::make_unique<LearnedPositionEmbeddings>(wte, std::move(wpe));
}

BuiltStage head_stage(const ModelConfig& c, WeightSource& w, const at::Tensor& embedding) {
  at::Tensor weight =
      c.tie_word_embeddings ? embedding : w.get("lm_head.weight", {c.vocab_size, c.hidden_size});
  return {StageKind::kHead, std::make_unique<Linear>("lm_head", weight, at::Tensor())};
}

}  // namespace actcap
