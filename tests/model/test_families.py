"""Qwen2 / Qwen2.5, Qwen3, Mistral, Gemma 2 and Gemma 3 against HF transformers (torch, float32): random
tiny models built with transformers' config classes, saved with `save_pretrained` and loaded from the dir.
Sequences run past every sliding window. Logits (and layer by layer) within 1e-4 of HF's, greedy tokens
equal to HF's `generate` (a prompt longer than a prefill chunk included), prefill chunks against float64
numpy, greedy speculative decoding equal to plain AR for every draft on Gemma 3 (local + global layers,
local RoPE), orbax conversion and several EOS ids. GGUF, tokenizers and refusals: test_family_loading.py."""
import functools
import json

import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax import Model, drafts, generate, logits
from checkpoints_convert.__main__ import main as convert_main
from magicdec_jax.checkpoints import load_model
from magicdec_jax.drafts.model import truncate_layers
from magicdec_jax.feature_head import init_head
from magicdec_jax.layers.prefill_attention import causal_chunk_attention
from magicdec_jax.trees import default_tree

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from family_models import BASE, FAMILIES, SEQ, TOL, hf_logits, hf_model, ids, max_diff  # noqa: E402


@functools.lru_cache(maxsize=None)
def saved(name: str, tmp_root: str):
  """(HF model, its save_pretrained dir), once per family and test session."""
  model = hf_model(name)
  path = f"{tmp_root}/{name}"
  model.save_pretrained(path)
  return model, path


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("families"))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_match_hf(name, tmp_root):
  hf, path = saved(name, tmp_root)
  ours = load_model(path)
  x = ids()
  want = hf_logits(hf, x)
  diff = max_diff(logits(ours, x), want)
  print(f"{name}: max |logit diff| = {diff:.2e} (logit scale {np.abs(want).max():.2f}), windows "
        f"{ours.config.layer_windows}")
  assert diff < TOL
  cfg = ours.config
  if cfg.layer_windows:     # the comparison sees the windows: without them the logits move far off
    assert max(cfg.layer_windows) < SEQ
    assert max_diff(logits(Model(cfg.replace(layer_windows=()), ours.params), x), want) > 100 * TOL
  if cfg.local_rope_theta is not None:
    assert max_diff(logits(Model(cfg.replace(local_rope_theta=None), ours.params), x), want) > 100 * TOL


def test_family_features_read(tmp_root):
  """What each family maps to (docs/families.md's table), read from the saved config.json."""
  c = {n: load_model(saved(n, tmp_root)[1]).config for n in ("qwen2", "qwen3", "qwen3-window-bias", "gemma2",
                                                              "gemma3", "mistral")}
  assert c["qwen2"].qkv_bias and not c["qwen2"].o_bias and c["qwen2"].layer_windows == (0, 0, 7, 7)
  assert c["qwen3"].qk_norm and c["qwen3"].head_dim == 24 and not c["qwen3"].qkv_bias and not c["qwen3"].layer_windows
  assert c["qwen3-window-bias"].qkv_bias and c["qwen3-window-bias"].o_bias
  assert c["qwen3-window-bias"].layer_windows == (0, 9, 9, 9)
  assert c["mistral"].layer_windows == (6,) * 4
  g2, g3 = c["gemma2"], c["gemma3"]
  assert g2.layer_windows == (5, 0, 5, 0) and (g2.attn_softcap, g2.final_softcap) == (3.0, 2.0)
  assert g3.layer_windows == (5, 0, 5, 5) and g3.local_rope_theta == 100.0 and g3.rope_theta == 1000.0
  assert g3.rope_scaling.kind == "linear" and g3.local_rope_scaling is None and g3.qk_norm
  for g in (g2, g3):
    assert g.norm_plus_one and g.post_norms and g.embed_scale and g.activation == "gelu_tanh"
    assert g.query_pre_attn_scalar == 20 and g.tie_embeddings


@pytest.mark.parametrize("name", ["gemma3", "qwen3-window-bias"])
def test_layer_by_layer(name, tmp_root):
  """After every layer i: our model cut to i layers, read out through the final norm and head, equals HF's
  hidden state i read out by HF's own norm, head and soft-cap."""
  hf, path = saved(name, tmp_root)
  ours = load_model(path)
  x = ids(seed=1)
  _, hidden = hf_logits(hf, x, hidden=True)
  cap = getattr(hf.config, "final_logit_softcapping", None)
  for i in range(1, ours.config.num_layers):
    with torch.no_grad():
      want = hf.lm_head(hf.model.norm(hidden[i]))
      want = (torch.tanh(want / cap) * cap if cap else want).numpy()
    cut = Model(ours.config.replace(num_layers=i), dict(ours.params, layers=ours.params["layers"][:i]))
    assert max_diff(logits(cut, x), want) < TOL, i


def hf_greedy(model, prompt, n):
  model.generation_config.eos_token_id = None
  with torch.no_grad():
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, pad_token_id=0)
  return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("name,prompt_len", [("gemma3", 12), ("qwen2", 12), ("mistral", 300), ("gemma2", 12),
                                             ("qwen3-window-bias", 12)])
def test_greedy_matches_hf_generate(name, prompt_len, tmp_root):
  """Prefill (one chunk, or two with a 300-token prompt) and AR decoding past the windows."""
  hf, path = saved(name, tmp_root)
  prompt = ids(1, prompt_len, seed=2)[0]
  want = hf_greedy(hf, prompt, 20)
  got = generate(load_model(path), [prompt], max_new_tokens=20, temperature=0.0, eos_token_id=[]).tokens[0]
  assert got == want


def numpy_window_attention(q, k, v, window, scale, softcap):
  """float64 reference: q [T,H,D] at positions 0..T-1, k/v [T,K,D]; banded causal softmax."""
  t, h, d = q.shape
  g = h // k.shape[1]
  out = np.zeros_like(q, dtype=np.float64)
  for i in range(t):
    for j in range(h):
      s = k[:, j // g] @ q[i, j] * scale
      s = np.tanh(s / softcap) * softcap if softcap else s
      keep = (np.arange(t) <= i) & (np.arange(t) > i - window)
      p = np.where(keep, np.exp(s - s[keep].max()), 0)
      out[i, j] = p @ v[:, j // g] / p.sum()
  return out


@pytest.mark.parametrize("window,softcap", [(5, None), (9, 2.5), (1, None)])
def test_prefill_chunks_honour_the_window(window, softcap):
  """causal_chunk_attention over 3 chunks of 8 (prefix blocks read from the cache) against float64 numpy."""
  rng = np.random.default_rng(window)
  t, c, h, kh, d = 24, 8, 4, 2, 8
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in ((t, h, d), (t, kh, d), (t, kh, d)))
  want = numpy_window_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), window,
                                0.3, softcap)
  cache_k, cache_v = (jnp.asarray(x.transpose(1, 0, 2))[None] for x in (k, v))
  for start in range(0, t, c):
    got = causal_chunk_attention(jnp.asarray(q[None, start:start + c]), jnp.asarray(k[None, start:start + c]),
                                 jnp.asarray(v[None, start:start + c]), cache_k, cache_v, jnp.int32(start),
                                 scale=0.3, softcap=softcap, window=window)
    np.testing.assert_allclose(np.asarray(got[0]), want[start:start + c], atol=1e-5)


# ------------------------------------------------------------------------- speculative == AR, windowed

@pytest.fixture(scope="module")
def gemma3(tmp_root):
  return load_model(saved("gemma3-untied", tmp_root)[1])


@pytest.fixture(scope="module")
def gemma3_prompts_and_ar(gemma3):
  prompts = [ids(1, 40, seed=3)[0], ids(1, 290, seed=4)[0]]
  return prompts, generate(gemma3, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=[]).tokens


@pytest.mark.parametrize("way", ["streaming", "streaming-tree", "snapkv", "model", "lookup", "feature"])
def test_speculative_equals_ar_on_gemma3(way, gemma3, gemma3_prompts_and_ar):
  """Greedy speculative decoding on a windowed target (local layers window 5, a global layer) is
  token-identical to AR for every draft: self-drafts whose sink + window rings span the local windows,
  a truncated model draft, prompt lookup and a random feature head."""
  prompts, ar = gemma3_prompts_and_ar
  kw = {
      "streaming": dict(draft=drafts.StreamingDraft(2, 8), gamma=3),
      "streaming-tree": dict(draft=drafts.StreamingDraft(2, 8), tree=default_tree("sequoia16")),
      "snapkv": dict(draft=drafts.SnapKVDraft(budget=8, window=8), gamma=3),
      "model": dict(draft=drafts.ModelDraft(truncate_layers(gemma3, 2), sink=2, window=8), gamma=3),
      "lookup": dict(draft=drafts.PromptLookupDraft(2), gamma=3),
      "feature": dict(draft=drafts.FeatureDraft(init_head(gemma3), sink=2, window=8), gamma=2),
  }[way]
  res = generate(gemma3, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=[], **kw)
  assert res.tokens == ar
  assert len(set(ar[0] + ar[1])) > 10 and res.stats["acceptance_rate"] < 1   # real rejections happen


def test_self_draft_ring_keeps_each_layer_window(gemma3):
  """A self-draft whose ring holds the whole context computes what the target does only if its windowed
  layers keep just the keys inside their windows (DenseMask.key_pos): then it proposes exactly the target's
  greedy tokens, acceptance 1 (with the ring's windows ignored it measured 0.09)."""
  prompts = [ids(1, 40, seed=3)[0], ids(1, 60, seed=4)[0]]
  res = generate(gemma3, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=[],
                 draft=drafts.StreamingDraft(0, 256), gamma=3)
  assert res.stats["acceptance_rate"] == 1.0
  assert res.tokens == generate(gemma3, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=[]).tokens


# ------------------------------------------------------------------------------------- loading extras

def test_several_eos_ids_all_stop_a_row(tmp_root, tmp_path):
  """generation_config.json's EOS list joins config.json's: each id stops a row (as Qwen's <|im_end|> and
  <|endoftext|>, Gemma's <eos> and <end_of_turn>)."""
  hf, path = saved("qwen2", tmp_root)
  hf.save_pretrained(tmp_path)
  prompt = ids(1, 12, seed=5)[0]
  free = hf_greedy(hf, prompt, 12)
  first, absent = free[3], next(t for t in range(BASE["vocab_size"]) if t not in free)
  cfg = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps(dict(cfg, eos_token_id=absent)))
  (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [absent, first]}))
  model = load_model(str(tmp_path))
  assert model.config.eos_token_ids == (absent, first)
  res = generate(model, [prompt], max_new_tokens=12, temperature=0.0)
  assert res.tokens[0] == free[:free.index(first) + 1] and res.finish_reasons == ["eos"]


@pytest.mark.parametrize("name", ["gemma3", "qwen2"])
def test_orbax_conversion_keeps_the_family(name, tmp_root, tmp_path):
  """`python -m checkpoints_convert` of an HF dir, then the orbax dir loads to HF's logits."""
  hf, path = saved(name, tmp_root)
  assert convert_main(["--src", path, "--dst", str(tmp_path / "ck")]) == 0
  back = load_model(str(tmp_path / "ck"))
  assert back.config == load_model(path).config
  assert max_diff(logits(back, ids()), hf_logits(hf, ids())) < TOL


def test_sharded_safetensors_dir(tmp_path):
  """A sharded dir (model.safetensors.index.json) of a family with biases and q/k norms."""
  hf = hf_model("qwen3-window-bias", seed=16)
  hf.save_pretrained(tmp_path, max_shard_size="40KB")
  assert (tmp_path / "model.safetensors.index.json").is_file() and len(list(tmp_path.glob("model-*"))) > 2
  assert max_diff(logits(load_model(str(tmp_path)), ids()), hf_logits(hf, ids())) < TOL


def test_windowed_layers_take_the_xla_path(monkeypatch):
  """A Pallas impl is asked for: a windowed (or soft-capped) layer runs the XLA path, a plain one the kernel."""
  from magicdec_jax import pallas
  from magicdec_jax.layers.attention import PrefixTree, attend

  def kernel(*a, **k):
    raise AssertionError("the Pallas kernel was called")

  monkeypatch.setattr(pallas, "tree_attention", kernel)
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((1, 3, 4, 8), (1, 2, 32, 8), (1, 2, 32, 8)))
  spec = PrefixTree(jnp.array([20]), jnp.tril(jnp.ones((3, 3), bool)))
  pos = jnp.arange(20, 23)[None]
  assert attend(q, k, v, spec, "pallas_interpret", q_pos=pos, window=5).shape == q.shape
  assert attend(q, k, v, spec, "pallas_interpret", q_pos=pos, softcap=3.0).shape == q.shape
  with pytest.raises(AssertionError, match="Pallas kernel was called"):
    attend(q, k, v, spec, "pallas_interpret", q_pos=pos)


@pytest.mark.parametrize("case,batch,prompt", [("ar", 1, 64), ("chain", 3, 64), ("chain", 3, 320)])
def test_windowed_decode_loop_reads_weights_and_caches_in_place(case, batch, prompt, monkeypatch):
  """test_hlo_no_copies.py's check on a model with every family feature (biases, q/k norms, Gemma norms and
  GeGLU, soft-caps, local and global layers with their own RoPE): the window masks add no copy of a weight
  or a cache layer to the compiled decode loop; with a 320-token prompt the local layers are rings."""
  import test_hlo_no_copies as hlo_check
  monkeypatch.setattr(hlo_check, "P", prompt)
  family = hlo_check.CFG.replace(qkv_bias=True, o_bias=True, qk_norm=True, norm_plus_one=True, post_norms=True,
                                 activation="gelu_tanh", embed_scale=True, query_pre_attn_scalar=10.0,
                                 attn_softcap=20.0, final_softcap=15.0, layer_windows=(6, 0, 6),
                                 local_rope_theta=100.0)
  monkeypatch.setattr(hlo_check, "CFG", family)
  hlo_check.test_decode_loop_copies_no_weight_or_cache(case, batch)
