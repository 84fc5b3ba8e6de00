#include "models/parts/fused_mlp.h"

namespace actcap {

FusedGatedMlp::FusedGatedMlp(const std::string& name, int64_t width, int64_t inner,
                             std::unique_ptr<Module> gate_up, std::unique_ptr<Module> act,
                             std::unique_ptr<Module> down)
    : Module(name, hidden_point(name + ":input", width), hidden_point(name, width)),
      inner_(inner),
      gate_up_(add(std::move(gate_up))),
      act_(add(std::move(act))),
      down_(add(std::move(down))) {}

at::Tensor FusedGatedMlp::forward(const at::Tensor& x, ForwardState& st) {
  auto gate_up = gate_up_->call(x, st);
  // HF: gate, up = gate_up.chunk(2, -1); up * act(gate). The gate half is a strided view: the
  // activation gets it contiguous, as its hook point is a plain [inner] row.
  auto gate = gate_up.narrow(-1, 0, inner_).contiguous();
  auto up = gate_up.narrow(-1, inner_, inner_);
  return down_->call(up * act_->call(gate, st), st);
}

}  // namespace actcap
