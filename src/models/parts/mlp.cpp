#include "models/parts/mlp.h"

namespace actcap {

Mlp::Mlp(const std::string& name, int64_t width, std::unique_ptr<Module> fc,
         std::unique_ptr<Module> act, std::unique_ptr<Module> proj)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      fc_(add(std::move(fc))),
      act_(add(std::move(act))),
      proj_(add(std::move(proj))) {}

at::Tensor Mlp::forward(const at::Tensor& x, ForwardState& st) {
  return proj_->call(act_->call(fc_->call(x, st), st), st);
}

// Children in the order the forward calls them: HF evaluates act_fn(gate_proj(x)) before
// up_proj(x).
GatedMlp::GatedMlp(const std::string& name, int64_t width, std::unique_ptr<Module> gate,
                   std::unique_ptr<Module> act, std::unique_ptr<Module> up,
                   std::unique_ptr<Module> down)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      gate_(add(std::move(gate))),
      act_(add(std::move(act))),
      up_(add(std::move(up))),
      down_(add(std::move(down))) {}

at::Tensor GatedMlp::forward(const at::Tensor& x, ForwardState& st) {
  auto a = act_->call(gate_->call(x, st), st);
  return down_->call(a * up_->call(x, st), st);
}

}  // namespace actcap
