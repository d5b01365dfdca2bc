"""The feature-head draft (FeatureDraft) and its training (distill_feature).

Greedy: token-exact against plain autoregressive `generate` (draft=None), chains and trees, windows that
cut and windows longer than every prompt, with a head trained briefly on the tiny target (so acceptance is
strictly between 0 and 1 and both accept and reject paths run). The in-loop acceptance with gamma=1 is
replayed from an independent teacher-forced computation: the target's features from one plain causal
pass over prompt + output, the head over them with an explicit sink + window mask; every round's accept
decision (head argmax at L-2 == the target's token at L) must come out the same, row by row. Sampling is
tested by the calibrated chi-square test in test_speculative_sampling.py (feature cases there); meshes in
test_sharding.py. Training: the loss falls and held-out acceptance rises; a run cut into pieces (steps and
seconds) ends with the params an uninterrupted run ends with; save / load round-trips.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import tempfile
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from magicdec_jax.tuning import autotune
from magicdec_jax.training import distill_feature as dfm
from magicdec_jax import feature_head
from magicdec_jax.generation import generate
from magicdec_jax.drafts import FeatureDraft
from magicdec_jax.model import Model, full_forward
from magicdec_jax.trees import Tree, default_tree

from conftest import random_prompts, tiny_model

NEW = 24
LENGTHS = (9, 16, 12, 14, 10)
TRAIN = dfm.FeatureDistillConfig(steps=120, lr=3e-3, warmup_steps=10, batch=8, seq_len=64, sink=2,
                                 window=16, eval_every=60, checkpoint_every=40)


def target():
  return tiny_model(0, attn_scale=10.0)


@functools.lru_cache(maxsize=None)
def train_data() -> np.ndarray:
  """Windows of text the target itself samples (temperature 1), prompts of random tokens."""
  prompts = random_prompts([8] * 48, 64, seed=3)
  gen = generate(target(), prompts, max_new_tokens=64, temperature=1.0, seed=1).tokens
  return np.asarray([p + g for p, g in zip(prompts, gen)], np.int32)[:, :TRAIN.seq_len]


@functools.lru_cache(maxsize=None)
def trained():
  """(head, history) after TRAIN on train_data (held-out: the last 4 windows, not trained on)."""
  data = train_data()
  out = tempfile.mkdtemp(prefix="feature_head_")
  try:
    return dfm.train(target(), feature_head.init_head(target(), seed=1), data[:-4], out, TRAIN,
                     eval_windows=data[-4:], progress=False)
  finally:
    shutil.rmtree(out, ignore_errors=True)


def test_training_loss_falls_and_acceptance_rises():
  _, hist = trained()
  assert [h["step"] for h in hist] == [0, 60, 120]
  assert hist[-1]["loss"] < hist[1]["loss"]
  first = [h["acceptance"][0] for h in hist]
  assert first[0] < 0.1 and first[-1] > 0.4 and first[-1] > first[1], first
  assert all(h["acceptance"][k] > 0.25 for h in hist[1:] for k in range(TRAIN.ttt))   # deeper depths learn


def test_target_outputs_over_a_draft_vocabulary():
  """target_outputs(vocab=ids) (the training step's target pass for a head with a draft vocabulary): its
  logits equal a plain causal pass's (full_forward, no cache) at those ids, and a float64 numpy LM head over
  the last block's state; its features are those of the full-vocabulary call."""
  t = target()
  cfg = t.config
  tokens = jnp.asarray(random_prompts([16, 16], cfg.vocab_size, seed=5), jnp.int32)
  ids = (1, 5, 9, 33, 63)
  logits, feats = dfm.target_outputs(t.params, cfg, tokens, (0,), ids)
  assert logits.shape == (2, 16, len(ids)) and logits.dtype == jnp.float32
  ref = np.asarray(full_forward(t.params, cfg, tokens))[..., list(ids)]
  np.testing.assert_allclose(np.asarray(logits), ref, rtol=1e-4, atol=1e-4)
  _, top = dfm.target_outputs(t.params, cfg, tokens, (cfg.num_layers - 1,))     # the last block's state
  h = np.asarray(top, np.float64)
  x = h / np.sqrt((h * h).mean(-1, keepdims=True) + cfg.rms_norm_eps) * np.asarray(t.params["final_norm"]["scale"])
  w = np.asarray(t.params["embed"] if cfg.tie_embeddings else t.params["lm_head"].T, np.float64)[list(ids)]
  np.testing.assert_allclose(np.asarray(logits), x @ w.T, rtol=1e-4, atol=1e-4)
  full, feats_full = dfm.target_outputs(t.params, cfg, tokens, (0,))
  assert full.shape[-1] == cfg.vocab_size
  np.testing.assert_array_equal(np.asarray(feats), np.asarray(feats_full))


def test_bfloat16_training_learns_like_float32():
  """compute="bfloat16" (the target's pass and the head's matmuls on bfloat16 copies, float32 master
  weights): the same run as `trained()` learns about as well as that float32 run (held-out acceptance,
  measured in float32 both times) and its head stays float32."""
  data = train_data()
  out = tempfile.mkdtemp(prefix="feature_head_bf16_")
  try:
    head, hist = dfm.train(target(), feature_head.init_head(target(), seed=1), data[:-4], out,
                           dataclasses.replace(TRAIN, compute="bfloat16"), eval_windows=data[-4:],
                           progress=False)
  finally:
    shutil.rmtree(out, ignore_errors=True)
  _, ref = trained()
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(head.params))
  got, want = hist[-1]["acceptance"][0], ref[-1]["acceptance"][0]
  assert got > 0.4 and abs(got - want) < 0.1, (got, want)


@functools.lru_cache(maxsize=None)
def reference(extra: int = 0):
  prompts = random_prompts(LENGTHS, 64, seed=11)
  return prompts, generate(target(), prompts, max_new_tokens=NEW + extra).tokens


CASES = [   # (sink, window, gamma or tree, expect acceptance strictly inside (0, 1))
    (2, 16, 3, True),
    (1, 5, 1, True),
    (2, 64, 4, True),
    (0, 4, "sequoia16", True),
    (2, 16, "random", True),
]


@pytest.mark.parametrize("sink,window,shape,mid", CASES, ids=[f"s{s}-w{w}-{g}" for s, w, g, _ in CASES])
def test_greedy_exact(sink, window, shape, mid):
  prompts, ref = reference()
  head, _ = trained()
  if shape == "random":
    kw = dict(tree=Tree.from_children_counts([3, 2, 1, 0, 2, 1]))
  elif isinstance(shape, str):
    kw = dict(tree=default_tree(shape))
  else:
    kw = dict(gamma=shape)
  res = generate(target(), prompts, max_new_tokens=NEW, draft=FeatureDraft(head, sink, window), **kw)
  assert res.tokens == ref
  acc = res.stats["acceptance_rate"]
  if mid:
    assert 0.0 < acc < 1.0, acc


def teacher_forced_predictions(head, seq: list[int], sink: int, window: int) -> np.ndarray:
  """Head argmax at every position of seq (true features, sink + window mask), independent of the loop."""
  t = target()
  tokens = jnp.asarray([seq], jnp.int32)
  _, feats = dfm.target_outputs(t.params, t.config, tokens, tuple(head.layers))
  logits = dfm.unroll(head.params, head.config, t.params, feats, tokens, 1, sink, window)[0]
  return np.argmax(np.asarray(logits)[0], -1)          # [T-1]: position t predicts token t+2


# slow: on the 2-vCPU Intel VM of 2026-11-24 the default suite took 96 min (CI allows 90); run with -m slow
@pytest.mark.slow
@pytest.mark.parametrize("sink,window", [(2, 16), (1, 3)])
def test_inloop_acceptance_replays_teacher_forced(sink, window):
  prompts, long_ref = reference(extra=2)
  head, _ = trained()
  res = generate(target(), prompts, max_new_tokens=NEW, draft=FeatureDraft(head, sink, window), gamma=1)
  total_acc = 0
  for p, out, rs in zip(prompts, long_ref, res.row_stats):
    full = p + out
    pred = teacher_forced_predictions(head, full, sink, window)
    length, emitted, rounds, acc = len(p), 0, 0, 0
    while emitted < NEW:
      n = int(pred[length - 2] == full[length])
      rounds, acc, emitted, length = rounds + 1, acc + n, emitted + n + 1, length + n + 1
    assert (rs["verify_steps"], rs["accepted_tokens"]) == (rounds, acc)
    total_acc += acc
  assert 0 < total_acc < sum(r["verify_steps"] for r in res.row_stats)


@pytest.mark.slow
def test_resume_in_pieces_equals_one_run():
  data = train_data()[:-4]
  cfg = dfm.FeatureDistillConfig(steps=6, lr=3e-3, warmup_steps=2, batch=4, seq_len=64, sink=2, window=16,
                                 checkpoint_every=2)
  head = feature_head.init_head(target(), seed=2)
  with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
    one, _ = dfm.train(target(), head, data, a, cfg, progress=False)
    part, _ = dfm.train(target(), head, data, b, cfg, progress=False, stop_after=3)     # checkpoint at 3
    part, _ = dfm.train(target(), head, data, b, cfg, progress=False, stop_after_s=0.0)  # one step: 4
    assert not os.path.exists(os.path.join(b, feature_head.HEAD_FILE))    # unfinished: no head yet
    piece, _ = dfm.train(target(), head, data, b, cfg, progress=False)
    for x, y in zip(jax.tree.leaves(one.params), jax.tree.leaves(piece.params)):
      np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=1e-4, atol=1e-5)
    loaded = feature_head.load_head(b)
    assert loaded.layers == head.layers and loaded.config == head.config
    prompts, ref = reference()
    r1 = generate(target(), prompts, max_new_tokens=NEW, draft=FeatureDraft(piece, 2, 16), gamma=2)
    r2 = generate(target(), prompts, max_new_tokens=NEW, draft=FeatureDraft(loaded, 2, 16), gamma=2)
    assert r1.tokens == r2.tokens == ref
    assert r1.stats["acceptance_rate"] == r2.stats["acceptance_rate"]
    with pytest.raises(ValueError, match="other settings"):
      dfm.train(target(), head, data, b, dataclasses.replace(cfg, lr=1e-3), progress=False)
    with pytest.raises(ValueError, match="other settings.*'data'"):        # other windows: not a resume
      dfm.train(target(), head, data[::-1], b, cfg, progress=False)


@pytest.mark.slow
def test_draft_vocabulary_trains_and_stays_exact(tmp_path):
  """A head with its own smaller vocabulary (EAGLE-3): trained briefly it accepts (0 < acceptance < 1), its
  greedy output equals plain AR's on a chain and a tree, it never proposes a token outside its vocabulary,
  and it round-trips through save / load."""
  data = train_data()
  t = target()
  vocab = feature_head.frequent_vocab(data[:-4], 40, t.config.vocab_size, always=(63,))
  assert len(vocab) in (40, 41) and 63 in vocab and list(vocab) == sorted(set(vocab))
  cfg = dataclasses.replace(TRAIN, steps=40, eval_every=0)
  head, hist = dfm.train(t, feature_head.init_head(t, seed=1, vocab=vocab), data[:-4], str(tmp_path / "h"),
                         cfg, eval_windows=data[-4:], progress=False)
  assert head.params["vocab_head"].shape == (len(vocab), t.config.hidden_size) and head.vocab == vocab
  assert hist[-1]["acceptance"][0] > hist[0]["acceptance"][0]
  prompts, ref = reference()
  for kw in (dict(gamma=3), dict(tree=Tree.from_children_counts([3, 2, 1, 0, 2, 1]))):
    res = generate(t, prompts, max_new_tokens=NEW, draft=FeatureDraft(head, 2, 16), **kw)
    assert res.tokens == ref
    assert 0.0 < res.stats["acceptance_rate"] < 1.0, res.stats["acceptance_rate"]
  logits = feature_head.to_target_vocab(jnp.zeros((1, 1, len(vocab))), vocab, t.config.vocab_size)
  outside = np.setdiff1d(np.arange(t.config.vocab_size), vocab)
  assert np.all(np.asarray(jax.nn.softmax(logits))[0, 0, outside] == 0.0)   # never proposed, q = 0 exactly
  spec = FeatureDraft(head, 2, 16).spec           # the cost model prices its LM head over the draft vocabulary
  assert autotune.cost_draft(spec).config.vocab_size == len(vocab) < t.config.vocab_size
  loaded = feature_head.load_head(str(tmp_path / "h"))
  assert loaded.vocab == vocab
  np.testing.assert_array_equal(np.asarray(loaded.params["vocab_head"]), np.asarray(head.params["vocab_head"]))


def test_bad_inputs_named():
  t = target()
  with pytest.raises(ValueError, match=r"feature layers must be distinct indices in \[0, 2\)"):
    feature_head.init_head(t, layers=(0, 5))
  other = tiny_model(1, hidden=16, heads=2, kv_heads=1, layers=1)
  with pytest.raises(ValueError, match="hidden_size=16 differs"):
    generate(t, [[1, 2, 3]], max_new_tokens=2, draft=FeatureDraft(feature_head.init_head(other), 1, 4))
  half = Model(t.config.replace(dtype="bfloat16"), jax.tree.map(lambda a: a.astype(jnp.bfloat16), t.params))
  with pytest.raises(ValueError, match="feature head dtype=bfloat16 differs from the target's float32"):
    generate(t, [[1, 2, 3]], max_new_tokens=2, draft=FeatureDraft(feature_head.init_head(half), 1, 4))
  with pytest.raises(ValueError, match="FeatureDraft needs a feature_head.FeatureHead"):
    FeatureDraft(t, 1, 4)
  with pytest.raises(ValueError, match="window must be an integer >= 1"):
    FeatureDraft(feature_head.init_head(t), 1, 0)
  with pytest.raises(ValueError, match=r"seq_len=64\] token windows"):
    dfm.train(t, feature_head.init_head(t), np.zeros((3, 10), np.int32), "/nonexistent/x", TRAIN)
  with pytest.raises(ValueError, match="ttt must be"):
    dfm.FeatureDistillConfig(ttt=0).validate()
  with pytest.raises(ValueError, match=r"compute must be one of \('float32', 'bfloat16'\), got 'float16'"):
    dfm.FeatureDistillConfig(compute="float16").validate()
  with pytest.raises(ValueError, match="no feature head"):
    feature_head.load_head(tempfile.gettempdir() + "/definitely_not_a_head_dir")
  with pytest.raises(ValueError, match=r"draft vocabulary ids must be in \[0, 64\), got 3\.\.64"):
    feature_head.init_head(t, vocab=[3, 64])
  with pytest.raises(ValueError, match="repeated ids"):
    feature_head.init_head(t, vocab=[3, 3])
  with pytest.raises(ValueError, match="non-empty 1-D"):
    feature_head.init_head(t, vocab=[])
  with pytest.raises(ValueError, match=r"draft vocabulary size must be in \[1, 64\], got 0"):
    feature_head.frequent_vocab(np.zeros(8, np.int32), 0, 64)


def test_a_head_built_for_another_target_warns(tmp_path):
  """Same shapes, another model (its norm scales differ, as a fine-tune's do): a warning naming both
  signatures; the head's own target, the same model in bfloat16-rounded norms, and a head file written
  before heads were signed pass silently. Saved and loaded, a head keeps its target."""
  t = target()
  tuned = Model(t.config, dict(t.params, final_norm={"scale": t.params["final_norm"]["scale"] * 1.25}),
                name="tuned")
  head = feature_head.init_head(t)
  feature_head.save_head(head, str(tmp_path / "h"))
  loaded = feature_head.load_head(str(tmp_path / "h"))
  assert loaded.target == head.target is not None
  with pytest.warns(UserWarning, match=f"built for a target signed {head.target}, and 'tuned' signs"):
    FeatureDraft(loaded, 2, 8).check_compatible(tuned)
  same = Model(t.config, jax.tree.map(lambda a: a.astype(jnp.bfloat16).astype(a.dtype), t.params))
  meta = os.path.join(str(tmp_path / "h"), feature_head.HEAD_FILE)
  with open(meta) as f:
    text = f.read()
  with open(meta, "w") as f:
    f.write(text.replace(f', "target": "{head.target}"', ""))
  unsigned = feature_head.load_head(str(tmp_path / "h"))
  assert unsigned.target is None
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    FeatureDraft(loaded, 2, 8).check_compatible(t)
    FeatureDraft(loaded, 2, 8).check_compatible(same)
    FeatureDraft(unsigned, 2, 8).check_compatible(tuned)


@pytest.mark.slow
def test_cli_distill_then_generate(tmp_path):
  """run.py --mode=distill --draft=feature writes a head that --draft=feature --draft_model=DIR loads; the
  greedy text equals --draft=none's (the random tiny byte-level model)."""
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=root)
  text = tmp_path / "text.txt"
  text.write_text("To be, or not to be, that is the question. " * 40)
  head_dir = tmp_path / "head"
  base = [sys.executable, "run.py", "--model=random-tiny:0"]
  r = subprocess.run(base + ["--mode=distill", "--draft=feature", f"--distill_data={text}",
                             f"--distill_out={head_dir}", "--distill_steps=3", "--batch=2", "--seq_len=32",
                             "--window=16", "--checkpoint_every=2", "--noprogress"],
                     capture_output=True, text=True, cwd=root, env=env, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  assert os.path.isfile(head_dir / feature_head.HEAD_FILE)
  gen = base + ["--mode=generate", "--prompt=To be, or", "--max_new_tokens=12"]
  outs = [subprocess.run(gen + extra, capture_output=True, text=True, cwd=root, env=env, timeout=600)
          for extra in (["--draft=none"], ["--draft=feature", f"--draft_model={head_dir}", "--window=16"])]
  for o in outs:
    assert o.returncode == 0, o.stderr[-3000:]
  assert outs[0].stdout == outs[1].stdout and outs[0].stdout.strip()
  bad = subprocess.run(base + ["--mode=generate", "--prompt=x", "--draft=feature"], capture_output=True,
                       text=True, cwd=root, env=env, timeout=600)
  assert bad.returncode != 0 and "--draft=feature needs --draft_model" in bad.stderr


def test_a_damaged_head_directory_is_a_value_error_naming_it(tmp_path):
  """Params of another head under this head's file (orbax restores the stored shapes whatever it is asked),
  an unreadable or incomplete head file, missing params: each a ValueError naming the directory, before
  any decode (they were a reshape TypeError mid-decode, a bare JSONDecodeError, a KeyError, orbax's own)."""
  import json
  a, b = str(tmp_path / "a"), str(tmp_path / "b")
  feature_head.save_head(feature_head.init_head(tiny_model(0)), a)
  feature_head.save_head(feature_head.init_head(tiny_model(0, hidden=64)), b)
  shutil.rmtree(os.path.join(a, feature_head.PARAMS_DIR))
  shutil.copytree(os.path.join(b, feature_head.PARAMS_DIR), os.path.join(a, feature_head.PARAMS_DIR))
  with pytest.raises(ValueError, match=f"feature head '{a}': params.* has shape .*64.*says.*32"):
    feature_head.load_head(a)
  head_file = os.path.join(b, feature_head.HEAD_FILE)
  meta = json.loads(open(head_file).read())
  for text in ("{not json", json.dumps({k: v for k, v in meta.items() if k != "layers"})):
    with open(head_file, "w") as f:
      f.write(text)
    with pytest.raises(ValueError, match=f"cannot read the feature head in '{b}'"):
      feature_head.load_head(b)
  with open(head_file, "w") as f:
    json.dump(meta, f)
  shutil.rmtree(os.path.join(b, feature_head.PARAMS_DIR))
  with pytest.raises(ValueError, match=f"cannot restore the feature head's params in '{b}'"):
    feature_head.load_head(b)
