"""Numerical parity with HF transformers' LlamaForCausalLM (torch, float32): random tiny configs covering
GQA/MHA, llama3/linear RoPE scaling and tied/untied heads (logits and layer by layer), then SmolLM2 loaded
by both libraries from the same GGUF (logits, greedy tokens, tokenizer, chat template); speculative greedy
decoding's log-probabilities against HF's teacher-forced log_softmax."""
import contextlib
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax import Model, StreamingDraft, generate, logits
from magicdec_jax.cache import KVCache
from magicdec_jax.checkpoints import known_model_path, load_model
from magicdec_jax.config import ModelConfig, RopeScaling
from magicdec_jax.layers.attention import PrefixTree
from magicdec_jax.layers.rope import rope_frequencies, tabled_rotation
from magicdec_jax.model import forward
from magicdec_jax.tokenizer import render_chat

from conftest import REAL_MODEL_XLA, random_hf_llama
from references import hf_model, ours_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TINY_TOL = 1e-4
SMOL_TOL = 1e-3
SEQ = 40
SHAKESPEARE = [
    "ROMEO: But, soft! what light through yonder window breaks? It is the east, and Juliet is the sun.",
    "Now is the winter of our discontent made glorious summer by this sun of York;",
    "All the world's a stage, and all the men and women merely players.",
    "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him.",
]
LLAMA3 = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
LINEAR = {"rope_type": "linear", "factor": 3.0}
CASES = {  # name: (kv heads, rope scaling, tied)
    "gqa-llama3": (2, LLAMA3, False),
    "mha-plain-tied": (4, None, True),
    "gqa-linear-tied": (1, LINEAR, True),
    "mha-llama3": (4, LLAMA3, False),
}


def hf_forward(model, ids):
  with torch.no_grad():
    out = model(torch.tensor(ids), output_hidden_states=True)
  return out.logits.float().numpy(), [h.float() for h in out.hidden_states]


def token_ids(vocab, batch=2, seed=0):
  return np.random.default_rng(seed).integers(0, vocab, size=(batch, SEQ)).tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_logits_match_hf(case):
  kv, scaling, tied = CASES[case]
  hf = hf_model(kv, scaling, tied)
  ours = ours_from_hf(hf)
  assert ours.config.tie_embeddings == tied and ours.config.num_kv_heads == kv
  assert (ours.config.rope_scaling is None) == (scaling is None)
  ids = token_ids(256)
  want, _ = hf_forward(hf, ids)
  got = logits(ours, ids)
  diff = float(np.max(np.abs(got - want)))
  print(f"{case}: max |logit diff| = {diff:.2e} (logit scale {np.abs(want).max():.2f})")
  assert diff < TINY_TOL
  if scaling is not None:
    # The comparison is sensitive to the scaling: dropping it moves the logits far beyond the tolerance.
    plain = logits(Model(ours.config.replace(rope_scaling=None), ours.params), ids)
    assert np.max(np.abs(plain - want)) > 100 * TINY_TOL


@pytest.mark.parametrize("case", ["gqa-llama3", "mha-plain-tied"])
def test_tiny_layer_by_layer(case):
  """After every layer i: our model cut to i layers, read out through the final norm and head, equals
  HF's hidden state i read out the same way."""
  kv, scaling, tied = CASES[case]
  hf = hf_model(kv, scaling, tied, seed=1)
  ours = ours_from_hf(hf)
  ids = token_ids(256, seed=1)
  _, hidden = hf_forward(hf, ids)
  n = ours.config.num_layers
  assert len(hidden) == n + 1
  for i in range(1, n):
    with torch.no_grad():
      want = hf.lm_head(hf.model.norm(hidden[i])).numpy()
    cut = Model(ours.config.replace(num_layers=i),
                dict(ours.params, layers=ours.params["layers"][:i]))
    diff = float(np.max(np.abs(logits(cut, ids) - want)))
    assert diff < TINY_TOL, (i, diff)
  np.testing.assert_allclose(logits(ours, ids), hf_forward(hf, ids)[0], atol=TINY_TOL, rtol=0)



@pytest.mark.parametrize("theta", [10000.0, 500000.0, 1000000.0])
@pytest.mark.parametrize("scaling", [None, "linear", "llama3"])
def test_rope_frequencies_are_transformers_float32(theta, scaling):
  """The inverse frequencies are the float32 values transformers computes (its `rotary_emb.inv_freq`) for
  the bases, head dims and scalings of common checkpoints, but for one ulp where torch's float32 pow is not
  correctly rounded (at most 2 of D/2); the exact (float64) values differ in a third of them."""
  from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
  for d in (64, 96, 128, 256):
    hf_scaling = {None: None, "linear": dict(rope_type="linear", factor=8.0),
                  "llama3": dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192)}[scaling]
    rs = None if scaling is None else RopeScaling(kind=scaling, **{k: v for k, v in hf_scaling.items()
                                                                   if k != "rope_type"})
    hf = LlamaRotaryEmbedding(transformers.LlamaConfig(
        hidden_size=4 * d, num_attention_heads=4, head_dim=d, rope_theta=theta, rope_scaling=hf_scaling,
        max_position_embeddings=131072)).inv_freq.numpy()
    ours = rope_frequencies(ModelConfig(vocab_size=8, hidden_size=4 * d, intermediate_size=8, num_layers=1,
                                        num_heads=4, num_kv_heads=4, head_dim=d, rope_theta=theta,
                                        rope_scaling=rs, max_position_embeddings=131072))
    assert ours.dtype == np.float32
    ulps = np.abs(ours.view(np.int32).astype(np.int64) - hf.view(np.int32))
    assert ulps.max() <= 1 and (ulps > 0).sum() <= 2, (d, ulps)


def test_tabled_rotation_is_the_float32_angles_up_to_2_24():
  """Fixed-shape numerics' cos and sin (tables of the exact product, turned by the float32 product's rounding
  error) are within 3e-7 of float64 cos / sin of the float32 angle position x inv_freq at positions up to
  2**24 - 1 (the exact angle's are up to ~0.5 rad away there); a larger context is refused."""
  inv = np.concatenate([rope_frequencies(ModelConfig(vocab_size=8, hidden_size=512, intermediate_size=8, num_layers=1,
                                                     num_heads=4, num_kv_heads=4, head_dim=128, rope_theta=500000.0)),
                        np.asarray([1.0, 0.9999], np.float32)])
  rng = np.random.default_rng(0)
  positions = np.unique(np.concatenate([rng.integers(0, 1 << 24, 4000), [0, 255, 256, 4095, 4096, (1 << 24) - 1]]))
  cos, sin = jax.jit(lambda p: tabled_rotation(p, inv, 1 << 24))(jnp.asarray(positions[None], jnp.int32))
  angle = (positions.astype(np.float32)[:, None] * inv).astype(np.float64)
  assert np.abs(np.asarray(cos[0], np.float64) - np.cos(angle)).max() < 3e-7
  assert np.abs(np.asarray(sin[0], np.float64) - np.sin(angle)).max() < 3e-7
  with pytest.raises(ValueError, match="below 2\\*\\*24"):
    tabled_rotation(jnp.zeros((1, 1), jnp.int32), inv, (1 << 24) + 1)

@pytest.mark.parametrize("numerics", ["invariant", "fast"])
def test_logits_at_long_positions_match_hf(numerics):
  """16 tokens at positions 120,000 and on (HF given those position_ids; ours one pass writing them to a
  cache of 64 slots), LLaMA-3.1's RoPE (theta 500,000, llama3 scaling by 8 from 8,192): logits within
  TINY_TOL of HF's with either numerics. There an angle's float32 rounding is up to 4e-3 radians, which
  the models were trained with: the exact angles' logits are more than 10x TINY_TOL away."""
  hf = random_hf_llama(3, 0.2, vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                       rope_parameters=dict(LLAMA3, rope_theta=500000.0, factor=8.0,
                                            original_max_position_embeddings=8192),
                       initializer_range=0.15, rms_norm_eps=1e-5)
  ours = ours_from_hf(hf)
  cfg = dataclasses.replace(ours.config, numerics=numerics)
  n = 16                                    # (a fixed-shape verify pass takes at most 16 tokens on a CPU)
  ids = [row[:n] for row in token_ids(256, seed=3)]
  positions = 120_000 + np.arange(n)
  with torch.no_grad():
    want = hf(torch.tensor(ids), position_ids=torch.tensor(np.stack([positions] * 2))).logits.numpy()
  slots = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (2, n))
  got, _ = jax.jit(lambda p, toks, pos, cache: forward(p, cfg, toks, pos, cache, slots, PrefixTree(
      jnp.zeros((2,), jnp.int32), np.tri(n, dtype=bool))))(ours.params, jnp.asarray(ids, jnp.int32),
                                                             jnp.asarray(np.stack([positions] * 2), jnp.int32),
                                                             KVCache.zeros(cfg, 2, 64))
  diff = float(np.max(np.abs(np.asarray(got) - want)))
  print(f"{numerics}: max |logit diff| at positions 120,000+ = {diff:.2e}")
  assert diff < TINY_TOL

def test_hf_dir_round_trip_logits(tmp_path):
  hf = hf_model(2, LLAMA3, False, seed=2)
  hf.save_pretrained(tmp_path)
  ids = token_ids(256, seed=2)
  np.testing.assert_allclose(logits(load_model(str(tmp_path)), ids), hf_forward(hf, ids)[0],
                             atol=TINY_TOL, rtol=0)


def test_tiny_greedy_logprobs_match_hf():
  """Speculative greedy decoding's log-probabilities (logprobs=True) equal HF's float32 teacher-forced
  log_softmax over prompt + generated tokens."""
  hf = hf_model(2, LLAMA3, False, seed=3)
  ours = ours_from_hf(hf)
  prompts = [t[:12] for t in token_ids(256, seed=3)]
  res = generate(ours, prompts, max_new_tokens=12, logprobs=True, draft=StreamingDraft(sink=1, window=4), gamma=3)
  for prompt, toks, lps in zip(prompts, res.tokens, res.logprobs):
    with torch.no_grad():
      want = torch.log_softmax(hf(torch.tensor([prompt + toks])).logits.float(), -1)[0].numpy()
    np.testing.assert_allclose(lps, [want[len(prompt) - 1 + j, t] for j, t in enumerate(toks)], atol=TINY_TOL,
                               rtol=0)


# ----------------------------------------------------------------------------------- SmolLM2 (GGUF)

@pytest.fixture(scope="module")
def smol():
  return load_model("smollm2-135m")


@functools.lru_cache(maxsize=None)
def _memoised_gguf():
  import gguf
  return functools.lru_cache(maxsize=1)(gguf.GGUFReader), functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)


@contextlib.contextmanager
def hf_gguf_loading():
  """HF's own GGUF loading, with two of its repeated costs memoised: it parses the file's fields again for
  the config, the weights and the tokenizer, and builds gguf's tensor-name map once per module (~21 of
  ~30 s for SmolLM2 on a 2-vCPU VM). What it reads and computes is unchanged."""
  import gguf
  reader, names = _memoised_gguf()
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(gguf, "GGUFReader", reader)
    mp.setattr(gguf, "get_tensor_name_map", names)
    yield


@pytest.fixture(scope="module")
def hf_smol():
  path = known_model_path("smollm2-135m")
  with hf_gguf_loading():
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_smol_tokenizer():
  path = known_model_path("smollm2-135m")
  with hf_gguf_loading():
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.mark.heavy
def test_smollm2_logits_and_greedy_match_hf(smol, hf_smol):
  ids = smol.tokenizer.encode(SHAKESPEARE[0]).ids
  assert 20 <= len(ids) <= 30
  with torch.no_grad():
    want = hf_smol(torch.tensor([ids])).logits.float().numpy()
  got = logits(smol, [ids])
  diff = float(np.max(np.abs(got - want)))
  print(f"SmolLM2 GGUF: max |logit diff| = {diff:.2e} over {len(ids)} tokens (logit scale "
        f"{np.abs(want).max():.1f})")
  assert diff < SMOL_TOL
  with torch.no_grad():
    out = hf_smol.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=32, do_sample=False, pad_token_id=2)
  hf_new = out[0, len(ids):].tolist()
  ours_new = generate(smol, [ids], max_new_tokens=32, temperature=0.0, xla_options=REAL_MODEL_XLA).tokens[0]
  print("greedy:", repr(smol.tokenizer.decode(ours_new)))
  assert ours_new == hf_new


def test_tokenizer_matches_hf(smol, hf_smol_tokenizer):
  tok, ref = smol.tokenizer, hf_smol_tokenizer
  messages = [{"role": "user", "content": "Who wrote Hamlet?"},
              {"role": "assistant", "content": "William Shakespeare, around 1600."}]
  chat = render_chat(smol.chat_template, messages, add_generation_prompt=True)
  assert chat == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  texts = SHAKESPEARE + [chat, "  Thou art   more lovely\n\nand more temperate: 18 sonnets, 1609.\t<|im_end|>"]
  for text in texts:
    ours = tok.encode(text).ids
    assert ours == ref(text, add_special_tokens=True)["input_ids"], text
    assert tok.decode(ours, skip_special_tokens=False) == ref.decode(ours, skip_special_tokens=False)
  start, end = ref.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
  assert tok.encode(chat).ids.count(start) == chat.count("<|im_start|>") == 4 and end == 2
