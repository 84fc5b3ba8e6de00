// The gated MLP with one fused gate/up projection (Phi-3's gate_up_proj): rows [gate; up], each
// `inner` wide; out = down(act(gate) * up). The activation is a child module of its own (HF's
// `activation_fn`): its input point is the gate half, [inner] per token.
#pragma once

#include "models/module.h"

namespace actcap {

class FusedGatedMlp : public Module {
 public:
  FusedGatedMlp(const std::string& name, int64_t width, int64_t inner,
                std::unique_ptr<Module> gate_up, std::unique_ptr<Module> act,
                std::unique_ptr<Module> down);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  int64_t inner_;
  Module *gate_up_, *act_, *down_;
};

}  // namespace actcap
