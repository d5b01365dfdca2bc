"""The target's sliding-window layers keep rings (cache.py): window + a round + a prefill chunk, not the
whole context. Random tiny HF models (Gemma 3: local and global layers; Mistral: every layer local) against
HF transformers in float32: teacher-forced logits over prompts longer than the ring (prefilled in several
chunks, then 4-token rounds), greedy AR and speculative decoding (self-draft chain and tree, SnapKV, a model
draft) equal to HF `generate` several windows past a wrapped ring, continuous batching with refills of
short (linear-cache) and long (ring) prefills into one state, the rings' buffer shapes, and the memory
planner's and the cost model's window-aware bytes against a hand computation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax import ModelConfig, drafts, generate, loop, sharding
from magicdec_jax.cache import KVCache, aligned_slots, ring_margin, ring_sizes
from magicdec_jax.checkpoints import load_model
from magicdec_jax.drafts.model import truncate_layers
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.model import forward
from magicdec_jax.stream import generate_stream
from magicdec_jax.trees import Tree, default_tree
from magicdec_jax.tuning import costmodel, shapes

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from family_models import TOL, hf_logits, hf_model, ids, max_diff  # noqa: E402

RING = 272          # aligned_slots(window + 256) on a CPU for windows 5 and 6: prompts below run past it
NEW = 40            # new tokens: 8x Gemma 3's window, past the ring's wrap


@functools.lru_cache(maxsize=None)
def family(name: str, root: str):
  hf = hf_model(name)
  hf.generation_config.eos_token_id = None
  hf.save_pretrained(f"{root}/{name}")
  return hf, load_model(f"{root}/{name}")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("rings"))


def hf_greedy(hf, prompt, n=NEW):
  with torch.no_grad():
    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                      max_new_tokens=n, do_sample=False, pad_token_id=0)
  return out[0, len(prompt):].tolist()


PROMPTS = [ids(1, 300, seed=5)[0], ids(1, 37, seed=6)[0]]      # ragged: the short row's padding is dropped


@functools.lru_cache(maxsize=None)
def hf_tokens(name: str, root: str):
  hf, _ = family(name, root)
  return [hf_greedy(hf, p) for p in PROMPTS]


def test_ring_sizes():
  """Windowed layers keep aligned(window + margin) slots when that is smaller; global layers the context."""
  cfg = ModelConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=4, num_heads=2, num_kv_heads=1,
                    head_dim=4, layer_windows=(5, 0, 5, 1000))
  assert ring_sizes(cfg, 1024, ring_margin(4)) == (aligned_slots(261), 1024, aligned_slots(261), 1024)
  assert ring_sizes(cfg, 200, ring_margin(4)) == (200, 200, 200, 200)           # short: linear
  assert ring_sizes(cfg, 1024, None) == (1024,) * 4                                 # full cache on request
  assert ring_margin(300) == 301 and ring_margin(4, chunk=512) == 512
  cache = KVCache.zeros(cfg, 2, 1024, ring_margin(4))
  assert [c.shape for c in cache.k] == [(2, 1, 272, 4), (2, 1, 1024, 4), (2, 1, 272, 4), (2, 1, 1024, 4)]
  assert cache.num_slots == 1024 and cache.is_ring(0) and not cache.is_ring(1)


@pytest.mark.parametrize("name", ["gemma3-untied", "mistral"])
def test_teacher_forced_logits_through_rings_match_hf(name, root):
  """A 320-token prompt prefilled in five 64-token chunks (the local rings wrap), then 4-token chain rounds
  at positions 320..359: every logit within TOL of HF's full forward."""
  hf, model = family(name, root)
  seq = ids(1, 360, seed=7)
  want = hf_logits(hf, seq)[0]
  cfg, p = model.config, 320
  tokens = jnp.asarray([seq[0][:p]])
  target = loop.prefill(model.params, tokens, jnp.asarray([p]), cfg=cfg, num_slots=384,
                        margin=ring_margin(Tree.chain(3).num_nodes, 64), chunk=64)
  local = [i for i in range(cfg.num_layers) if cfg.layer_window(i)]
  assert local and all(target.k[i].shape[2] == RING for i in local)
  assert all(target.k[i].shape[2] == 384 for i in range(cfg.num_layers) if i not in local)
  step = jax.jit(lambda c, toks, base: forward(model.params, cfg, toks, base + jnp.arange(4)[None], c,
                                               base + jnp.arange(4)[None],
                                               PrefixTree(base, jnp.tril(jnp.ones((4, 4), bool)))))
  got = []
  for base in range(p, 360, 4):
    logits, target = step(target, jnp.asarray([seq[0][base:base + 4]]), jnp.asarray([base], jnp.int32))
    got.append(np.asarray(logits[0]))
  assert max_diff(np.concatenate(got), want[p:]) < TOL


CASES = {
    "ar": {},
    "chain": dict(draft=drafts.StreamingDraft(2, 4), gamma=3),
    "tree": dict(draft=drafts.StreamingDraft(2, 4), tree=default_tree("sequoia16")),
    "snapkv": dict(draft=drafts.SnapKVDraft(budget=8, window=8), gamma=3),
}


@pytest.mark.parametrize("name,case", [(n, c) for n in ("gemma3-untied", "mistral") for c in CASES
                                       if (n, c) != ("mistral", "ar")]      # Mistral's AR: test_families.py
                         + [pytest.param("mistral", "ar", marks=pytest.mark.slow),
                            pytest.param("gemma3-untied", "model", marks=pytest.mark.slow)])
def test_greedy_decoding_with_rings_equals_hf(name, case, root):
  """AR, self-draft chain and Sequoia tree, SnapKV and a model draft on the ring target: the tokens of HF
  `generate` for a 300-token prompt (ring wrapped, two prefill chunks) and a 37-token one beside it."""
  hf, model = family(name, root)
  kw = dict(draft=drafts.ModelDraft(truncate_layers(model, 2), sink=2, window=8), gamma=3) if case == "model" \
      else CASES[case]
  res = generate(model, PROMPTS, max_new_tokens=NEW, temperature=0.0, eos_token_id=[], **kw)
  assert res.tokens == hf_tokens(name, root)
  if case != "ar" and name != "mistral":       # Mistral's draft window 4 < 6 is all it differs by
    assert res.stats["acceptance_rate"] < 1


def test_tree_log_probs_through_rings_are_plain_decodings_bits(root):
  """Fixed-shape numerics (the CPU default) on Gemma 3's rings, float32 (no bfloat16 rounding to hide a
  summation order): a Sequoia tree's and a chain's greedy rows have plain decoding's tokens and log-probs bit
  for bit, though the tree's nodes sit at other ring slots than their depths (layers/invariant.py)."""
  _, model = family("gemma3-untied", root)
  kw = dict(max_new_tokens=24, temperature=0.0, eos_token_id=[], logprobs=True, numerics="invariant")
  plain = generate(model, PROMPTS, **kw)
  for case in ("tree", "chain"):
    res = generate(model, PROMPTS, **kw, **CASES[case])
    assert res.tokens == plain.tokens, case
    np.testing.assert_array_equal(np.asarray(res.logprobs, np.float64), np.asarray(plain.logprobs, np.float64),
                                  err_msg=case)

def test_stream_refills_into_rings_equal_hf(root):
  """Continuous batching on Gemma 3: 2 slots, refilled as rows finish, with prompts of 300, 20, 280 and 37
  tokens (short prompts prefill into linear caches, long ones into rings; both land in the ring state)."""
  hf, model = family("gemma3-untied", root)
  prompts = [PROMPTS[0], ids(1, 20, seed=8)[0], ids(1, 280, seed=9)[0], PROMPTS[1]]
  ref = hf_tokens("gemma3-untied", root)
  want = [ref[0][:24], hf_greedy(hf, prompts[1], 24), hf_greedy(hf, prompts[2], 24), ref[1][:24]]
  got = [None] * 4
  for r in generate_stream(model, prompts, batch_size=2, refill_at=1, max_new_tokens=24, temperature=0.0,
                           eos_token_id=[], draft=drafts.StreamingDraft(2, 8), gamma=2):
    got[r.index] = r.tokens
  assert got == want


def test_planner_and_cost_model_count_windows():
  """Gemma 3 27B at 32K context, batch 4, bf16: 52 local layers keep aligned(1024 + 256) = 1280 slots, the
  10 global ones 32768 (memory planner, by hand); a step reads min(context, 1024) tokens per local layer."""
  cfg = shapes.model_shape("gemma3_27b")
  per_slot = 2 * 4 * cfg.num_kv_heads * cfg.head_dim * 2               # K and V, 4 rows, bf16
  assert sum(1 for w in cfg.layer_windows if w == 1024) == 52 and cfg.num_layers == 62
  plan = sharding.plan_memory(cfg, None, batch=4, max_context=32768, tree_nodes=4)
  assert plan.target_kv == per_slot * (52 * aligned_slots(1280) + 10 * 32768)
  assert plan.target_kv < 0.2 * sharding.plan_memory(cfg.replace(layer_windows=()), None, batch=4,
                                                     max_context=32768, tree_nodes=4).target_kv
  assert costmodel.kv_read_tokens(cfg, 32768) == (52 * 1024 + 10 * 32768) / 62
  assert costmodel.kv_read_tokens(cfg, 512) == 512
  full = cfg.replace(layer_windows=())
  kv = 2 * 62 * cfg.num_kv_heads * cfg.head_dim * 2
  assert costmodel.step_bytes(full, 4, 32768, 1) - costmodel.step_bytes(cfg, 4, 32768, 1) == \
      4 * kv * (32768 - (52 * 1024 + 10 * 32768) / 62)


def test_adaptive_schedule_over_rings_equals_hf(root):
  """Adaptive speculation on the ring target: a forced schedule switching chain 2 -> plain ->
  chain 3 -> chain 1 inside the generated span (the batch's mean context runs 168 -> 208) gives HF
  `generate`'s tokens; plain rounds keep the self-draft's ring current while the target's rings wrap."""
  hf, model = family("gemma3-untied", root)
  res = generate(model, PROMPTS, max_new_tokens=NEW, temperature=0.0, eos_token_id=[],
                 draft=drafts.StreamingDraft(2, 8), gamma="auto",
                 schedule=[(0, 2), (178, 0), (188, 3), (198, 1)])
  assert res.tokens == hf_tokens("gemma3-untied", root)
  rounds = res.stats["schedule"]["rounds"]
  assert all(rounds[s] > 0 for s in ("plain", "gamma=1", "gamma=2", "gamma=3")), rounds
