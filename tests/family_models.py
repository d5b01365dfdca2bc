"""Random tiny HF models of every supported family (torch, float32), shared by test_families.py and
test_family_loading.py: built with transformers' config classes, norms and biases moved off their init."""
import numpy as np
import torch
import transformers

TOL = 1e-4
SEQ = 40
BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.15)
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
               "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000.0}}
GEMMA3_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
FAMILIES = {  # name: (causal LM class, config class, config fields beyond BASE)
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config",
              dict(use_sliding_window=True, sliding_window=7, max_window_layers=2, rope_theta=300.0)),
    "qwen2.5-tied": ("Qwen2ForCausalLM", "Qwen2Config", dict(tie_word_embeddings=True, rope_theta=300.0)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=24, rope_theta=300.0)),
    "qwen3-window-bias": ("Qwen3ForCausalLM", "Qwen3Config",
                          dict(head_dim=24, attention_bias=True, use_sliding_window=True, sliding_window=9,
                               max_window_layers=1, rope_theta=300.0)),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(sliding_window=6, rope_theta=300.0)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config",
               dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=20, attn_logit_softcapping=3.0,
                    final_logit_softcapping=2.0, rope_theta=300.0)),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig",
               dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=20, layer_types=GEMMA3_TYPES,
                    rope_parameters=GEMMA3_ROPE, final_logit_softcapping=5.0)),
    # untied: a tied tiny Gemma (embeddings x sqrt(hidden) read back by the same matrix) greedily repeats
    # its last token, which would make every draft accept everything
    "gemma3-untied": ("Gemma3ForCausalLM", "Gemma3TextConfig",
                      dict(head_dim=16, sliding_window=5, query_pre_attn_scalar=20, layer_types=GEMMA3_TYPES,
                           rope_parameters=GEMMA3_ROPE, tie_word_embeddings=False)),
}


def hf_model(name: str, seed: int = 0, **overrides):
  """A random tiny HF model of family `name`, norms and biases moved off their init so they are tested."""
  lm, conf, kw = FAMILIES[name]
  torch.manual_seed(seed)
  cfg = getattr(transformers, conf)(**{**BASE, **kw, **overrides})
  model = getattr(transformers, lm)(cfg).eval()
  with torch.no_grad():
    for n, p in model.named_parameters():
      if "norm" in n or "bias" in n:
        p.add_(0.2 * torch.randn_like(p))
  return model


def hf_logits(model, ids, hidden=False):
  with torch.no_grad():
    out = model(torch.tensor(ids), output_hidden_states=hidden)
  return (out.logits.float().numpy(), out.hidden_states) if hidden else out.logits.float().numpy()


def ids(batch=2, n=SEQ, seed=0):
  return np.random.default_rng(seed).integers(0, BASE["vocab_size"], size=(batch, n)).tolist()


def max_diff(a, b):
  return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
