// Feed-forward parts: fc -> act -> proj (GPT-2) and the gated form down(act(gate(x)) * up(x))
// (Llama family SwiGLU, GeGLU with a GELU activation). Children keep their HF names and points.
#pragma once

#include "models/module.h"

namespace actcap {

class Mlp : public Module {
 public:
  Mlp(const std::string& name, int64_t width, std::unique_ptr<Module> fc,
      std::unique_ptr<Module> act, std::unique_ptr<Module> proj);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *fc_, *act_, *proj_;
};

class GatedMlp : public Module {
 public:
  GatedMlp(const std::string& name, int64_t width, std::unique_ptr<Module> gate,
           std::unique_ptr<Module> act, std::unique_ptr<Module> up, std::unique_ptr<Module> down);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module *gate_, *act_, *up_, *down_;
};

}  // namespace actcap
