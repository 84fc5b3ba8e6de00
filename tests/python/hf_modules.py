"""A GPT-2 as torch.nn.Modules shaped like Hugging Face's GPT2LMHeadModel (modeling_gpt2.py):
the same module names (transformer.wte, transformer.h.N.attn.c_attn, ...), Conv1D weights stored
[in, out], attention modules returning a tuple (output, weights), blocks returning a tuple
(hidden,), the base model returning an output object with ``last_hidden_state``. Written from
the modeling code, not from actcap's C++; loads an ``actcap init-model --arch gpt2`` checkpoint
(or random weights of any size, for benchmarks).

Hazard knobs reproduce, on CPU, what makes naive hook capture wrong on real models:
- ``inplace_residual``: each block adds its residuals in place into the tensor it was given (as
  some HF models and accelerate's offload hooks write their inputs), so the previous block's
  output changes after its hook ran;
- ``static_output``: the final norm writes into one buffer reused by every forward (a static
  cache / CUDA-graph style output), so step 0's value is overwritten by step 1.
Both change nothing in the values computed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import reference as R


@dataclass
class GPT2Config:
    vocab_size: int = 256
    n_positions: int = 64
    n_embd: int = 32
    n_layer: int = 4
    n_head: int = 4
    layer_norm_epsilon: float = 1e-5
    model_type: str = "gpt2"
    _name_or_path: str = "hf_modules.GPT2"


@dataclass
class BaseModelOutput:
    last_hidden_state: torch.Tensor


@dataclass
class CausalLMOutput:
    logits: torch.Tensor
    last_hidden_state: torch.Tensor


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Conv1D(nn.Module):
    def __init__(self, nf, nx):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.weight.size(-1),)
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(size_out)


class GPT2Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.embed = cfg.n_head, cfg.n_embd
        self.c_attn = Conv1D(3 * cfg.n_embd, cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, hidden_states, attention_mask=None):
        B, T, _ = hidden_states.shape
        q, k, v = self.c_attn(hidden_states).split(self.embed, dim=2)
        hd = self.embed // self.n_head

        def heads(x):
            return x.view(B, T, self.n_head, hd).transpose(1, 2)

        q, k, v = heads(q), heads(k), heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / (float(hd) ** 0.5)
        causal = torch.ones(T, T, dtype=torch.bool, device=w.device).tril()
        mask_value = torch.finfo(w.dtype).min
        w = torch.where(causal, w, torch.full([], mask_value, dtype=w.dtype, device=w.device))
        if attention_mask is not None:
            w = w + attention_mask
        w = F.softmax(w, dim=-1)
        out = torch.matmul(w, v).transpose(1, 2).reshape(B, T, self.embed)
        return self.c_proj(out), None  # HF: (attn_output, attn_weights)


class GPT2MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(4 * cfg.n_embd, cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, 4 * cfg.n_embd)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg, inplace_residual=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = GPT2MLP(cfg)
        self.inplace_residual = inplace_residual

    def forward(self, hidden_states, attention_mask=None):
        attn_out = self.attn(self.ln_1(hidden_states), attention_mask=attention_mask)[0]
        if self.inplace_residual:  # writes into the tensor it was given: the previous output
            h = hidden_states.add_(attn_out)
            h.add_(self.mlp(self.ln_2(h)))
        else:
            h = hidden_states + attn_out
            h = h + self.mlp(self.ln_2(h))
        return (h,)


class StaticLayerNorm(nn.LayerNorm):
    """A LayerNorm writing into one output buffer reused by every forward."""

    def forward(self, x):
        y = super().forward(x)
        buf = getattr(self, "_static", None)
        if buf is None or buf.shape != y.shape:
            buf = self._static = torch.empty_like(y)
        return buf.copy_(y)


class GPT2Model(nn.Module):
    def __init__(self, cfg, inplace_residual=False, static_output=False):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg, inplace_residual) for _ in range(cfg.n_layer))
        norm = StaticLayerNorm if static_output else nn.LayerNorm
        self.ln_f = norm(cfg.n_embd, eps=cfg.layer_norm_epsilon)

    def forward(self, input_ids, attention_mask=None):
        B, T = input_ids.shape
        if attention_mask is not None:
            # positions count each row's real tokens (left padding included), as generate() does
            position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            ext = (1.0 - attention_mask[:, None, None, :].to(self.wte.weight.dtype))
            ext = ext * torch.finfo(self.wte.weight.dtype).min
        else:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
            ext = None
        h = self.wte(input_ids) + self.wpe(position_ids)
        for block in self.h:
            h = block(h, attention_mask=ext)[0]
        return BaseModelOutput(last_hidden_state=self.ln_f(h))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg=None, inplace_residual=False, static_output=False):
        super().__init__()
        cfg = cfg or GPT2Config()
        self.config = cfg
        self.transformer = GPT2Model(cfg, inplace_residual, static_output)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as GPT-2's

    def forward(self, input_ids, attention_mask=None):
        out = self.transformer(input_ids, attention_mask=attention_mask)
        return CausalLMOutput(logits=self.lm_head(out.last_hidden_state),
                              last_hidden_state=out.last_hidden_state)

    @classmethod
    def random(cls, seed=0, **kw):
        """Random weights (N(0, 0.02), LayerNorms 1/0 perturbed) of a config built from ``kw``."""
        knobs = {k: kw.pop(k) for k in ("inplace_residual", "static_output") if k in kw}
        m = cls(GPT2Config(**kw), **knobs)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in m.named_parameters():
                if name.endswith("bias") or ".ln_" in name:
                    base = 1.0 if (name.endswith("weight") and ".ln" in name) else 0.0
                    p.copy_(base + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(0.02 * torch.randn(p.shape, generator=g))
        return m.eval()

    @classmethod
    def from_checkpoint(cls, ckpt_dir, **knobs):
        """The weights of an ``actcap init-model --arch gpt2`` (HF layout) checkpoint."""
        cfg_json = R.load_config(ckpt_dir)
        cfg = GPT2Config(vocab_size=cfg_json["vocab_size"], n_positions=cfg_json["n_positions"],
                         n_embd=cfg_json["n_embd"], n_layer=cfg_json["n_layer"],
                         n_head=cfg_json["n_head"],
                         layer_norm_epsilon=cfg_json.get("layer_norm_epsilon", 1e-5),
                         _name_or_path=str(ckpt_dir))
        m = cls(cfg, **knobs)
        w = R._norm_gpt2_names(R.load_weights(ckpt_dir))
        state = {("transformer." + k): v.float() for k, v in w.items() if k != "lm_head.weight"}
        state["lm_head.weight"] = w.get("lm_head.weight", w["wte.weight"]).float()
        m.load_state_dict(state, strict=True)
        return m.eval()
