// Gemma's ends of the model. ScaledEmbedding: the token embedding times a constant (Gemma's
// sqrt(hidden_size) normaliser, rounded to float32 as HF's torch.tensor(..., dtype) does); its
// point is the scaled embedding. SoftcappedHead: a structural unit (no point of its own) around
// lm_head that soft-caps the logits, cap * tanh(logits / cap), as Gemma 2's
// final_logit_softcapping; the `lm_head` point is the uncapped projection, the stage's output (the
// model's logits) capped.
#pragma once

#include "models/module.h"

namespace actcap {

class ScaledEmbedding : public Module {
 public:
  ScaledEmbedding(const std::string& name, at::Tensor weight, float scale);

 protected:
  at::Tensor forward(const at::Tensor& ids, ForwardState& st) override;

 private:
  at::Tensor weight_;
  float scale_;
};

class SoftcappedHead : public Module {
 public:
  SoftcappedHead(std::unique_ptr<Module> head, int64_t width, double cap);

 protected:
  at::Tensor forward(const at::Tensor& x, ForwardState& st) override;

 private:
  Module* head_;
  double cap_;
};

}  // namespace actcap
