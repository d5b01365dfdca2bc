"""GGUF files of HF models, written the way llama.cpp's convert_hf_to_gguf.py lays them out (F32), for the
loader tests (test_checkpoints.py: llama; test_family_loading.py: qwen2, qwen3, gemma2, gemma3)."""
import gguf
import numpy as np

# llama.cpp's tensor names (gguf-py's TENSOR_NAMES), written out independently of checkpoints.py
NAMES = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
         "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "pre_feedforward_layernorm": "ffn_norm",
         "post_feedforward_layernorm": "post_ffw_norm"}


def _permute(w, n_heads):
  """llama.cpp's converter permutation (rotate-half rows -> interleaved pairs), written independently."""
  out = np.empty_like(w)
  hd = w.shape[0] // n_heads
  for h in range(n_heads):
    for j in range(hd // 2):
      out[h * hd + 2 * j] = w[h * hd + j]
      out[h * hd + 2 * j + 1] = w[h * hd + hd // 2 + j]
  return out


def write_gguf(path, model, arch, metadata=None, pattern=False, tokenizer=None, eos=5, extra=None, omit=()):
  """An F32 GGUF of an HF model as convert_hf_to_gguf.py writes one: the llama architecture's q/k rows
  interleaved (qwen and gemma use rotate-half RoPE: as HF), Gemma norms stored as 1 + w, the global RoPE
  base (Gemma 3: linear scaling of the global layers; with `pattern`, `rope.freq_base_swa` for the local ones
  and the sliding layers), the sliding window and Gemma 2's soft-caps. extra: further tensors {name: array};
  omit: metadata left out ("context_length", "layer_norm_rms_eps")."""
  c = model.config
  gemma = arch.startswith("gemma")
  rope = c.rope_parameters.get("full_attention", c.rope_parameters)
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(c.num_hidden_layers)
  if "context_length" not in omit:
    w.add_context_length(c.max_position_embeddings)
  w.add_embedding_length(c.hidden_size)
  w.add_feed_forward_length(c.intermediate_size)
  w.add_head_count(c.num_attention_heads)
  w.add_head_count_kv(c.num_key_value_heads)
  w.add_key_length(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
  w.add_rope_freq_base(float(rope["rope_theta"]))
  if "layer_norm_rms_eps" not in omit:
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
  w.add_eos_token_id(eos)
  if gemma:
    w.add_sliding_window(c.sliding_window)
  if arch == "gemma2":
    w.add_attn_logit_softcapping(c.attn_logit_softcapping)
    w.add_final_logit_softcapping(c.final_logit_softcapping)
  if arch == "gemma3" and rope.get("rope_type") == "linear":
    w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(rope["factor"])
  if pattern:      # a file that records its own local RoPE base and sliding layers
    w.add_rope_freq_base_swa(float(c.rope_parameters["sliding_attention"]["rope_theta"]))
    w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
  for key, value in (metadata or {}).items():
    w.add_uint32(key, value) if isinstance(value, int) else w.add_string(key, value)
  if tokenizer:       # (pre-tokenizer name, tokens, merges, token types): a byte-level BPE vocab
    pre, tokens, merges, types = tokenizer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_token_types(types)
  sd = {k: v.numpy().astype(np.float32) for k, v in model.state_dict().items()}
  shift = lambda name, t: t + np.float32(1) if gemma and name.endswith("norm.weight") else t
  w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
  for i in range(c.num_hidden_layers):
    for name, t in sd.items():
      prefix = f"model.layers.{i}."
      if name.startswith(prefix):
        base, kind = name[len(prefix):].rsplit(".", 1)
        gg = ("post_attention_norm" if gemma else "ffn_norm") if base == "post_attention_layernorm" else NAMES[base]
        heads = {"attn_q": c.num_attention_heads, "attn_k": c.num_key_value_heads}.get(gg)
        if arch == "llama" and heads:
          t = _permute(t, heads)
        w.add_tensor(f"blk.{i}.{gg}.{kind}", shift(name, t))
  w.add_tensor("output_norm.weight", shift("norm.weight", sd["model.norm.weight"]))
  if not c.tie_word_embeddings:
    w.add_tensor("output.weight", sd["lm_head.weight"])
  for name, t in (extra or {}).items():
    w.add_tensor(name, t)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
