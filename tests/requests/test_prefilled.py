"""Prefill once, decode several ways (magicdec_jax/prefilled.py): every decode gives the tokens a plain
autoregressive `generate` gives (greedy), decoding twice from one prefill gives the same tokens (the caches
are copied, not consumed), and the benchmark scripts built on it run end to end (--smoke)."""
import dataclasses
import json
import os

import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import backend, prefilled, textdata
from magicdec_jax import testing
from magicdec_jax.cli import demo as cli_demo
from magicdec_jax.trees import Tree
from conftest import random_prompts, tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("chunk", [pytest.param(16, marks=pytest.mark.slow), 64])
def test_every_draft_decodes_the_autoregressive_tokens(chunk):
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([70, 41, 96], model.config.vocab_size, seed=5)
  want = md.generate(model, prompts, max_new_tokens=12).tokens            # independent: prefill + AR inside generate
  pre = prefilled.prefill(model, prompts, max_new_tokens=12, chunk=chunk, progress=False)
  assert prefilled.decode(model, pre).tokens == want
  assert prefilled.decode(model, pre).tokens == want                      # the prefill is reusable
  draft_model = md.truncate_layers(tiny_model(3, attn_scale=8.0), 1)
  for draft, kw in [(md.StreamingDraft(2, 8), {"gamma": 3}), (md.SnapKVDraft(8, 8, 4), {"gamma": 2}),
                    (md.ModelDraft(draft_model, 2, 8), {"gamma": 2}),
                    (md.StreamingDraft(2, 8), {"tree": Tree((-1, 0, 0, 1))})]:
    res = prefilled.decode(model, pre, draft=draft, **kw)
    assert res.tokens == want, (draft, kw)
    assert res.stats["verify_steps"] > 0


def test_a_shared_prefix_is_prefilled_once_and_decodes_as_separate_prompts():
  """Prompts with a common document (3 chunks) and different tails: the prefix is computed for one row and
  copied; every row's cache equals a prefill without sharing, and decoding gives plain generate's tokens."""
  model = tiny_model(3, attn_scale=8.0)
  doc = random_prompts([48], model.config.vocab_size, seed=11)[0]
  tails = random_prompts([20, 9, 30], model.config.vocab_size, seed=12)
  prompts = [doc + t for t in tails]
  assert prefilled.shared_chunks(prompts, 16) == 3 and prefilled.shared_chunks(prompts, 20) == 2
  assert prefilled.shared_chunks([doc, doc], 16) == 3 and prefilled.shared_chunks([doc], 16) == 0
  want = md.generate(model, prompts, max_new_tokens=10).tokens            # independent: generate's own prefill
  shared = prefilled.prefill(model, prompts, max_new_tokens=10, chunk=16, progress=False)
  plain = prefilled.prefill(model, prompts, max_new_tokens=10, chunk=16, progress=False, share_prefix=False)
  assert shared.shared_tokens == 48 and plain.shared_tokens == 0
  for a, b in zip(shared.target.k + shared.target.v, plain.target.k + plain.target.v):
    np.testing.assert_allclose(np.asarray(a)[:3], np.asarray(b)[:3], rtol=1e-5, atol=1e-5)
  assert prefilled.decode(model, shared).tokens == want
  assert prefilled.decode(model, shared, draft=md.StreamingDraft(2, 8), gamma=3).tokens == want
  same = prefilled.prefill(model, [doc, doc, doc], max_new_tokens=10, chunk=16, progress=False)
  assert same.shared_tokens == 48 and same.target.k[0].shape[0] == 4          # every chunk shared, 4-row bucket
  assert prefilled.decode(model, same).tokens == md.generate(model, [doc] * 3, max_new_tokens=10).tokens


def test_document_prompts_share_the_document_and_differ_after_it():
  tok = testing.random_tiny_model(0).tokenizer            # byte-level: the text's bytes
  rows = textdata.document_prompts(tok, 3, 300, 256)
  assert [len(r) for r in rows] == [300] * 3
  assert rows[0] == textdata.shakespeare_prompt(tok, 300)
  assert all(r[:256] == rows[0][:256] for r in rows) and len({tuple(r[256:]) for r in rows}) == 3
  assert textdata.document_prompts(tok, 2, 64, 0) == textdata.shakespeare_prompts(tok, 2, 64)
  with pytest.raises(ValueError, match="shared_tokens"):
    textdata.document_prompts(tok, 2, 64, 64)


def test_bad_arguments_are_refused():
  model = tiny_model(3)
  pre = prefilled.prefill(model, [[1, 2, 3]], max_new_tokens=4, chunk=16, progress=False)
  with pytest.raises(ValueError, match="max_new_tokens"):
    prefilled.decode(model, pre, max_new_tokens=9)
  with pytest.raises(ValueError, match="chunk"):
    prefilled.prefill(model, [[1, 2, 3]], max_new_tokens=4, chunk=0)
  with pytest.raises(ValueError, match="context"):
    prefilled.prefill(model, [[1] * 500], max_new_tokens=40)
  # the cache holds this model's K/V: another model of the same shape would decode silently from it
  with pytest.raises(ValueError, match="model 'tiny4.*' is not the one this batch was prefilled with"):
    prefilled.decode(tiny_model(4), pre)
  # K/V of other numerics than the decode's would not be generate's
  fast = prefilled.prefill(model, [[1, 2, 3]], max_new_tokens=4, chunk=16, progress=False, numerics="fast")
  with pytest.raises(ValueError, match="numerics='invariant', but the batch was prefilled with numerics='fast'"):
    prefilled.decode(model, fast, numerics="invariant")


def test_a_prefilled_batch_decodes_generates_log_probs_bit_for_bit():
  """With fixed-shape numerics (the CPU default) the prefill computes the K/V `generate` computes: a float32
  model's log-probs from a prefilled batch (chunks of 16, the shared prefix for one row) are generate's
  (speculating: its tokens; this model's head dim of 8 is below what chains' bits are tested at,
  docs/decisions.md#cpu-opt-preset); decode's numerics default to the prefill's."""
  model = tiny_model(3, attn_scale=8.0)
  doc = random_prompts([40], model.config.vocab_size, seed=2)[0]
  prompts = [doc + t for t in random_prompts([21, 5, 33], model.config.vocab_size, seed=3)]
  kw = dict(max_new_tokens=10, logprobs=True)
  want = md.generate(model, prompts, **kw, numerics="invariant")
  pre = prefilled.prefill(model, prompts, max_new_tokens=10, chunk=16, progress=False, numerics="invariant")
  assert pre.shared_tokens == 32
  res = prefilled.decode(model, pre, **kw)
  assert res.tokens == want.tokens
  assert [np.asarray(r).tobytes() for r in res.logprobs] == [np.asarray(r).tobytes() for r in want.logprobs]
  assert prefilled.decode(model, pre, draft=md.StreamingDraft(2, 8), gamma=3, **kw).tokens == want.tokens
  # a DecodeSettings is taken as given (its max_new_tokens too, not the prefill's room)
  st = md.DecodeSettings(max_new_tokens=3, numerics="invariant")
  assert prefilled.decode(model, pre, settings=st).tokens == [t[:3] for t in want.tokens]
  # other fixed shapes (a benchmark's design): the prefill computes at them, decode takes them by default
  # and refuses others, whose K/V would not be generate's
  design = dataclasses.replace(backend.fixed_shapes(), prefill_tile=(16, 32), key_block=32)
  want_d = md.generate(model, prompts, **kw, numerics="invariant", fixed_shapes=design)
  pre_d = prefilled.prefill(model, prompts, max_new_tokens=10, chunk=16, progress=False, fixed_shapes=design)
  got_d = prefilled.decode(model, pre_d, **kw)
  assert [np.asarray(r).tobytes() for r in got_d.logprobs] == [np.asarray(r).tobytes() for r in want_d.logprobs]
  with pytest.raises(ValueError, match="fixed_shapes=.* differ from the prefill's"):
    prefilled.decode(model, pre, fixed_shapes=design)
  with pytest.raises(ValueError, match="fixed_shapes=.* differ from the prefill's"):
    prefilled.decode(model, pre_d, settings=st)


def test_loop_rounds_are_the_slowest_rows():
  """stats["loop_rounds"] (what the demo divides its decode time by) is the batch's round count: with AR
  every round emits one token per row, so it is the longest output; speculating, the most rounds a row ran."""
  model = tiny_model(3, attn_scale=8.0)
  prompts = random_prompts([40, 23, 57], model.config.vocab_size, seed=9)
  ar = md.generate(model, prompts, max_new_tokens=11)
  assert ar.stats["loop_rounds"] == max(len(t) for t in ar.tokens)
  sd = md.generate(model, prompts, max_new_tokens=11, draft=md.StreamingDraft(2, 8), gamma=3)
  assert sd.tokens == ar.tokens
  assert sd.stats["loop_rounds"] == max(r["verify_steps"] for r in sd.row_stats)
  assert sd.stats["loop_rounds"] >= sd.stats["verify_steps"] / len(prompts)


def test_demo_runs_and_checks_its_own_tokens(capsys):
  """The main job's code path (cli_demo.compare) on a random tiny model: greedy MagicDec equals AR there."""
  model = testing.random_tiny_model(0)
  res = cli_demo.compare(model, batch=2, prompt_tokens=300, max_new_tokens=8, gamma=2, sink=2, window=16,
                         temperature=0.0, seed=0, progress=False, log=lambda m: None, root=ROOT, shared_tokens=256)
  assert res["identical"] and res["speedup"] > 0 and len(res["speedup_by_run"]) == 2
  assert res["shared_tokens"] == 256                 # one 256-token chunk prefilled once for both rows
  out = capsys.readouterr().out
  assert "speedup" in out and "identical greedy tokens: True" in out and "crossover" in out
  assert "alternated runs" in out and "the batch ran" in out and res["tail"] >= 1.0
  assert "predictability" in out and 0.0 <= res["copied_share"] <= 1.0
  res = cli_demo.compare(model, batch=4, prompt_tokens=300, max_new_tokens=8, gamma=2, sink=2, window=16,
                         temperature=0.0, seed=0, progress=False, log=lambda m: None, root=ROOT, repeats=1,
                         shrink_batch=True)
  assert res["identical"] and "rounds at batch 4" in capsys.readouterr().out
  with pytest.raises(ValueError, match="shared_tokens"):
    cli_demo.compare(model, batch=2, prompt_tokens=64, max_new_tokens=8, gamma=2, sink=2, window=16,
                     temperature=0.0, seed=0, progress=False, log=lambda m: None, root=ROOT, shared_tokens=64)


def test_demo_reads_the_newest_sweep_of_this_device(tmp_path):
  """The demo's crossover line: the sweeps of this device kind (this CPU model's if any) merged point by
  point, the newest recorded date winning whatever the file names sort as; none recorded -> None."""
  res = tmp_path / "benchmarks" / "results"
  res.mkdir(parents=True)
  assert cli_demo.measured_crossover(str(tmp_path), "cpu:cpu") is None
  def write(name, date, device, speedups, cpu_model=None):
    """speedups: {batch: {context: best decode speedup}}"""
    env = {"date": date, "device": device, **({"cpu_model": cpu_model} if cpu_model else {})}
    points = [{"batch": b, "context": c, "best_decode_speedup": v}
              for b, row in speedups.items() for c, v in row.items()]
    (res / name).write_text(json.dumps({"env": env, "points": points}))
  write("context_sweep_cpu_2026-11-23_z.json", "2026-11-23T10:00:00", "cpu:cpu",
        {4: {2048: 0.9, 8000: 1.1}, 1: {2048: 0.5}})
  write("context_sweep_cpu_2026-11-23.json", "2026-11-23T12:00:00", "cpu:cpu",
        {4: {1024: 0.8, 2048: 1.05, 8000: 1.2}, 1: {1024: 0.6, 2048: 0.7}})
  write("context_sweep_gpu_2026-11-24.json", "2026-11-24T12:00:00", "gpu:H100", {4: {1024: 1.5}})
  line = cli_demo.measured_crossover(str(tmp_path), "cpu:cpu")
  # the newer file's 2048 (1.05) wins over the older one's (0.9): 4 crosses at 2048
  assert "batch 1: not reached up to 2048, batch 4: 2048" in line
  assert "context_sweep_cpu_2026-11-23.json" in line and "_z.json" not in line   # every point re-measured
  # A sweep recorded on this host's CPU model wins over a newer one from another CPU, and the line says so.
  write("context_sweep_cpu_2026-11-20.json", "2026-11-20T12:00:00", "cpu:cpu",
        {8: {2048: 0.9, 4096: 1.1, 8000: 1.3}}, "CPU A")
  line = cli_demo.measured_crossover(str(tmp_path), "cpu:cpu", "CPU A")
  assert "context_sweep_cpu_2026-11-20.json" in line and "on this CPU (CPU A)" in line and "batch 8: 4096" in line
  line = cli_demo.measured_crossover(str(tmp_path), "cpu:cpu", "CPU B")
  assert "context_sweep_cpu_2026-11-23.json" in line and "an unrecorded CPU" in line
  # A later sweep of one batch x context adds to the earlier points instead of hiding them (a one-point
  # sweep at 8 x 8000 must not turn batch 8's crossover into '<= 8000').
  write("context_sweep_cpu_2026-11-21_8k.json", "2026-11-21T12:00:00", "cpu:cpu", {8: {8000: 1.6}}, "CPU A")
  line = cli_demo.measured_crossover(str(tmp_path), "cpu:cpu", "CPU A")
  assert "batch 8: 4096" in line
  assert "context_sweep_cpu_2026-11-20.json" in line and "context_sweep_cpu_2026-11-21_8k.json" in line
  # A newer loss at 2048 with a win at 1024 before it keeps the crossover above the loss; a batch that
  # won already at the smallest context measured bounds its crossover from above only.
  write("context_sweep_cpu_2026-11-22.json", "2026-11-22T12:00:00", "cpu:cpu",
        {8: {1024: 1.1, 2048: 0.95}, 2: {1024: 1.2, 2048: 1.3}, 1: {8000: 0.9}}, "CPU A")
  line = cli_demo.measured_crossover(str(tmp_path), "cpu:cpu", "CPU A")
  assert "batch 1: not reached up to 8000, batch 2: <= 1024, batch 8: 4096" in line


def test_copied_share_counts_tokens_that_complete_a_seen_ngram():
  """Hand-counted: a token counts when it and the n - 1 before it already occurred as an n-gram."""
  # text 1 2 3 | 1 2 3 1 2: the new bigrams are (3,1) unseen, then (1,2) (2,3) (3,1) (1,2) all seen
  assert textdata.copied_share([1, 2, 3], [1, 2, 3, 1, 2], n=2) == 4 / 5
  assert textdata.copied_share([], [5, 6, 7, 8], n=2) == 0.0
  assert textdata.copied_share([9], [9, 9, 9], n=3) == 1 / 3                # (9,9,9) first ends at index 2
  assert textdata.copied_share([1, 2], [], n=2) == 0.0
  with pytest.raises(ValueError, match="n must be"):
    textdata.copied_share([1], [1], n=0)


def test_demo_quotes_the_sweeps_figure_at_its_own_shape(tmp_path):
  """measured_point: the newest sweep of this device that measured batch x context, with its acceptance."""
  res = tmp_path / "benchmarks" / "results"
  res.mkdir(parents=True)
  def write(name, date, speedup, acc, context=4096):
    (res / name).write_text(json.dumps({
        "env": {"date": date, "device": "cpu:cpu", "cpu_model": "CPU A"}, "max_new_tokens": 128,
        "points": [{"batch": 8, "context": context, "best_gamma": 2, "best_decode_speedup": speedup,
                    "spec": [{"gamma": 3, "acceptance_rate": 0.5}, {"gamma": 2, "acceptance_rate": acc}]}]}))
  assert cli_demo.measured_point(str(tmp_path), "cpu:cpu", 8, 4096, "CPU A") is None
  write("context_sweep_cpu_b.json", "2026-11-25T10:00:00", 1.12, 0.87)
  write("context_sweep_cpu_a.json", "2026-11-20T10:00:00", 0.9, 0.7)
  write("context_sweep_cpu_c.json", "2026-11-26T10:00:00", 1.5, 0.9, context=2048)
  line = cli_demo.measured_point(str(tmp_path), "cpu:cpu", 8, 4096, "CPU A")
  assert "1.12x" in line and "acceptance 0.87" in line and "context_sweep_cpu_b.json, 2026-11-25" in line
  assert "on this CPU (CPU A)" in line and "distinct prompts, 128 new tokens" in line
  assert cli_demo.measured_point(str(tmp_path), "gpu:H100", 8, 4096) is None
