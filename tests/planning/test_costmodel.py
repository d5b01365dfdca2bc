"""Tests for magicdec_jax.tuning.costmodel and magicdec_jax.tuning.shapes: byte counts, trends, S_inflection, calibration."""
import dataclasses
import math

import numpy as np
import pytest

from magicdec_jax.tuning import costmodel as cm
from magicdec_jax import trees
from magicdec_jax.tuning import shapes
from magicdec_jax.tuning.draft_cost import DraftCost

CFG = shapes.llama31_8b()
H100 = cm.HARDWARE["h100"]
A100_OH = dataclasses.replace(cm.HARDWARE["a100"], step_overhead_s=2e-3)
SELF = DraftCost(16 + 512)


@pytest.mark.parametrize("name,billions", [("llama31_8b", 8.03), ("llama32_1b", 1.236), ("llama2_7b", 6.738),
                                           ("tinyllama_1b", 1.100), ("smollm2_135m", 0.1345)])
def test_published_parameter_counts(name, billions):
  assert cm.num_params(shapes.model_shape(name)) / 1e9 == pytest.approx(billions, rel=2e-3)


def test_byte_counts_by_hand():
  # Llama-3.1-8B KV per token: 2 (K, V) * 32 layers * 8 heads * 128 * 2 bytes = 128 KiB.
  assert cm.kv_bytes_per_token(CFG) == 131072
  assert cm.kv_bytes_per_token(CFG, "float32") == 262144
  assert cm.param_bytes(CFG) == 2 * cm.num_params(CFG)
  b, n, t = 4, 1000, 3
  expect = (cm.matmul_params(CFG) * 2 + b * t * 4096 * 2 + (b * n + b * t) * 131072 + b * t * 128256 * 4)
  assert cm.step_bytes(CFG, b, n, t) == expect
  attn = 4 * b * t * (n + t) * 32 * 128 * 32
  assert cm.step_flops(CFG, b, n, t) == 2 * cm.matmul_params(CFG) * b * t + attn


def test_step_time_increases_in_batch_and_context():
  for hw in (H100, A100_OH):
    bs = [1, 2, 4, 8, 16, 32, 64, 128]
    ns = [128, 1024, 4096, 16384, 65536]
    grid = np.array([[cm.step_time(CFG, hw, b, n, 4) for n in ns] for b in bs])
    assert (np.diff(grid, axis=0) > 0).all() and (np.diff(grid, axis=1) > 0).all()
    tv = [cm.t_verify(CFG, hw, 16, 8192, k) for k in range(1, 20)]
    assert (np.diff(tv) >= 0).all() and tv[0] == cm.t_ar(CFG, hw, 16, 8192)


@pytest.mark.parametrize("draft", [SELF, DraftCost(16 + 512, shapes.llama32_1b()), DraftCost(1024 + 512)])
def test_draft_cost_independent_of_context(draft):
  ts = [cm.t_draft(CFG, H100, draft, 32, n) for n in (4096, 16384, 131072)]
  assert ts[0] == ts[1] == ts[2]
  assert cm.t_draft(CFG, H100, draft, 32, 100) < ts[0]  # short prompts: the cache is the whole context
  assert ts[0] == cm.step_time(draft.network_config(CFG), H100, 32, 4096, 1, kv_context=draft.kv_slots)
  # ... while the target's own decode step keeps growing with context.
  assert cm.t_ar(CFG, H100, 32, 131072) > 10 * cm.t_ar(CFG, H100, 32, 4096) / 2


def test_small_draft_model_cheaper_than_self_spec():
  small = DraftCost(16 + 512, shapes.llama32_1b())
  assert cm.t_draft(CFG, H100, small, 8, 32768) < cm.t_draft(CFG, H100, SELF, 8, 32768)


def test_a_bf16_weight_copy_halves_a_float32_self_drafts_weight_bytes():
  """A float32 target's self-draft on bfloat16 weights: at batch 1 the step is weight-bound, so the H100
  roofline prices it by bytes: matmul weights at 2 bytes each instead of 4 (by hand), the rest unchanged."""
  narrow = dataclasses.replace(SELF, weights_dtype="bfloat16")
  hw = dataclasses.replace(H100, step_overhead_s=0.0)
  full_t = cm.t_draft(CFG, hw, SELF, 1, 8192, dtype="float32")
  narrow_t = cm.t_draft(CFG, hw, narrow, 1, 8192, dtype="float32")
  saved_bytes = cm.matmul_params(CFG) * (4 - 2)
  assert full_t - narrow_t == pytest.approx(saved_bytes / hw.hbm_bytes_per_s, rel=0.05)
  assert cm.predicted_speedup(CFG, hw, narrow, 16, 32768, gamma=3, alpha=0.8, dtype="float32") > \
      cm.predicted_speedup(CFG, hw, SELF, 16, 32768, gamma=3, alpha=0.8, dtype="float32")


def test_verify_over_ar_tends_to_one():
  # Extra verify tokens add a fixed amount of work per row; the KV read grows with context, so the ratio falls to 1.
  for b in (1, 8, 64):
    ratios = [cm.t_verify(CFG, H100, b, n, 5) / cm.t_ar(CFG, H100, b, n) for n in (1024, 4096, 16384, 131072)]
    assert all(r >= 1 for r in ratios)
    assert (np.diff(ratios) < 0).all() and ratios[-1] - 1 < 1e-3, (b, ratios)
  # Away from that regime (big batch, short context) compute matters and verification costs much more than T_AR.
  assert cm.t_verify(CFG, H100, 256, 128, 8) / cm.t_ar(CFG, H100, 256, 128) > 1.5


def test_expected_tokens_chain():
  assert cm.expected_tokens_chain(0.8, 3) == pytest.approx(1 + 0.8 + 0.64 + 0.512)
  assert cm.expected_tokens_chain(1.0, 4) == 5.0
  assert cm.expected_tokens_chain(0.0, 4) == 1.0
  assert cm.expected_tokens_chain(0.9, 5) == pytest.approx(trees.Tree.chain(5).expected_tokens([0.9]))
  with pytest.raises(ValueError):
    cm.expected_tokens_chain(1.2, 3)


def test_tree_speedup_equals_chain_speedup_for_a_chain():
  for b, n in [(1, 4096), (64, 32768)]:
    chain = cm.predicted_speedup(CFG, H100, SELF, b, n, gamma=4, alpha=0.8)
    as_tree = cm.predicted_speedup(CFG, H100, SELF, b, n, tree=trees.Tree.chain(4), acceptance_vector=[0.8])
    assert chain == pytest.approx(as_tree)
    e = cm.expected_tokens_chain(0.8, 4)
    direct = e * cm.t_ar(CFG, H100, b, n) / (4 * cm.t_draft(CFG, H100, SELF, b, n) + cm.t_verify(CFG, H100, b, n, 5))
    assert chain == pytest.approx(direct)


def _brute_inflection(hw, gamma, alpha, lo, hi, step=1):
  """First n on an integer grid where S(128, n) > S(64, n), straight from predicted_speedup."""
  signs = []
  for n in range(lo, hi, step):
    s64 = cm.predicted_speedup(CFG, hw, SELF, 64, n, gamma=gamma, alpha=alpha)
    s128 = cm.predicted_speedup(CFG, hw, SELF, 128, n, gamma=gamma, alpha=alpha)
    signs.append((n, s128 > s64))
  first = next(n for n, pos in signs if pos)
  assert all(pos for n, pos in signs if n >= first), "batch gain changes sign more than once"
  return first


@pytest.mark.parametrize("hw,gamma", [(H100, 2), (H100, 4), (A100_OH, 3)])
def test_s_inflection_matches_grid(hw, gamma):
  si = cm.s_inflection(CFG, hw, SELF, gamma, 0.8)
  assert si == _brute_inflection(hw, gamma, 0.8, max(1, si - 300), si + 300)
  # The draft only gets cheaper than the target once the context exceeds its own cache (sink + window).
  assert si > SELF.kv_slots


@pytest.mark.parametrize("hw", [H100, A100_OH])
def test_speedup_grows_with_batch_only_beyond_inflection(hw):
  gamma, alpha = 3, 0.8
  si = cm.s_inflection(CFG, hw, SELF, gamma, alpha)
  sp = lambda b, n: cm.predicted_speedup(CFG, hw, SELF, b, n, gamma=gamma, alpha=alpha)
  batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
  for n in (2 * si, 8192, 32768, 131072):
    assert (np.diff([sp(b, n) for b in batches]) > 0).all(), n
  for n in (si // 4, si // 2, si - 1):
    assert sp(256, n) <= sp(128, n) <= sp(64, n), n


def test_s_inflection_none_when_draft_not_cheaper():
  # A 'self' draft whose window covers the whole range never gets cheaper than the target.
  wide = DraftCost(16 + (1 << 21))
  assert cm.s_inflection(CFG, H100, wide, 3, 0.8, n_max=65536) is None


def test_choose_gamma_is_argmax():
  g, s = cm.choose_gamma(CFG, H100, SELF, 32, 32768, 0.8, max_gamma=10)
  all_s = [cm.predicted_speedup(CFG, H100, SELF, 32, 32768, gamma=k, alpha=0.8) for k in range(1, 11)]
  assert g == 1 + int(np.argmax(all_s)) and s == max(all_s)


def test_choose_tree_beats_chains():
  vec = trees.DEFAULT_ACCEPTANCE_VECTOR
  tree, info = cm.choose_tree(CFG, H100, SELF, 16, 32768, vec, sizes=(4, 8, 16, 32), max_depth=8)
  assert info["speedup"] == pytest.approx(
      cm.predicted_speedup(CFG, H100, SELF, 16, 32768, tree=tree, acceptance_vector=vec), rel=1e-2)
  for g in range(1, 8):
    chain = cm.predicted_speedup(CFG, H100, SELF, 16, 32768, tree=trees.Tree.chain(g), acceptance_vector=vec)
    assert info["speedup"] >= chain


def test_plan_table_llama31_8b_h100():
  batches = [1, 2, 4, 8, 16, 32, 64]
  rows = cm.plan_table(CFG, H100, batches, [32768], SELF, alpha=0.8, tree_sizes=(2, 4, 8, 16))
  assert [r["batch"] for r in rows] == batches
  gammas = [r["gamma"] for r in rows]
  assert all(a <= b for a, b in zip(gammas, gammas[1:])), gammas
  assert gammas[-1] > gammas[0]
  speedups = [r["speedup"] for r in rows]
  assert (np.diff(speedups) > 0).all()
  assert all(r["draft_ratio"] < 1 and r["verify_ratio"] >= 1 for r in rows)
  assert rows[0]["fits"] and not rows[-1]["fits"]  # 64 x 32K x 128 KiB = 256 GiB of KV
  assert "speedup" in cm.format_plan(rows)
  # a profile of a device that reports no memory (a CPU's) cannot say: unknown, not True
  unknown = cm.plan_table(CFG, dataclasses.replace(H100, memory_bytes=math.inf), [64], [32768], SELF, alpha=0.8,
                          tree_sizes=(2, 4))
  assert unknown[0]["fits"] is None
  assert cm.format_plan(unknown).splitlines()[1].rstrip().endswith("?")


def _synthetic(hw, rng, noise=0.0):
  cfg = shapes.smollm2_135m("float32")
  shapes_ = [cm.StepShape(cfg, b, n, t, "float32")
             for b in (1, 4, 16, 64) for n in (64, 1024, 8192) for t in (1, 8, 64)]
  out = []
  for s in shapes_:
    t = hw.time(s.bytes, s.flops)
    out.append((s, t * (1 + noise * rng.standard_normal())))
  return out


@pytest.mark.parametrize("combine", ["max", "sum"])
def test_calibrate_recovers_parameters(combine):
  truth = cm.Hardware("cpu", 2.0e10, 1.5e11, math.inf, 3e-4, combine)
  rng = np.random.default_rng(0)
  fit = cm.calibrate("cpu", _synthetic(truth, rng), combine=combine)
  assert fit.hbm_bytes_per_s == pytest.approx(truth.hbm_bytes_per_s, rel=1e-6)
  assert fit.flops_per_s == pytest.approx(truth.flops_per_s, rel=1e-6)
  assert fit.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=1e-6)
  noisy = cm.calibrate("cpu", _synthetic(truth, rng, noise=0.02), combine=combine)
  assert noisy.hbm_bytes_per_s == pytest.approx(truth.hbm_bytes_per_s, rel=0.05)
  assert noisy.flops_per_s == pytest.approx(truth.flops_per_s, rel=0.05)


def test_calibrate_nonnegative_overhead():
  truth = cm.Hardware("x", 1e10, 1e11, math.inf, 0.0, "sum")
  meas = [(s, t * 0.999) for s, t in _synthetic(truth, np.random.default_rng(1))]
  meas = [(s, t - 1e-5) for s, t in meas]  # a negative intercept would fit best; NNLS must clamp it to 0
  fit = cm.calibrate("x", meas, combine="sum")
  assert fit.step_overhead_s >= 0


def test_hardware_scaled():
  h8 = H100.scaled(8)
  assert h8.hbm_bytes_per_s == 8 * H100.hbm_bytes_per_s and h8.memory_bytes == 8 * H100.memory_bytes
  assert cm.t_ar(CFG, h8, 8, 8192) == pytest.approx(cm.t_ar(CFG, H100, 8, 8192) / 8)


def test_auto_speculates_where_the_best_chain_pays_and_takes_the_shortest_within_the_tie():
  """autotune.choose's rule (docs/tuning.md), checked against the rule written out over the cost model's
  table on a grid: plain decoding only where even the best chain is predicted under 1 + AUTO_MARGIN;
  otherwise the shortest chain within AUTO_TIE of the best (which may itself be predicted under the margin:
  the first grid point below is one)."""
  from magicdec_jax.drafts import StreamingDraft
  from magicdec_jax.tuning import autotune
  cfg, spec = shapes.smollm2_135m("float32"), StreamingDraft(4, 256).spec
  hw = autotune.detect_hardware("cpu")
  points = [(4, 2304, 0.98)] + [(b, n, a) for b in (1, 4, 16) for n in (512, 2304, 6400) for a in (0.6, 0.8, 0.9)]
  for batch, context, alpha in points:
    table = cm.gamma_speedups(cfg, hw, autotune.cost_draft(spec), batch, context, alpha, 3, cfg.dtype)
    best = max(s for _, s in table)
    shortest = next(g for g, s in table if s >= best * (1 - autotune.AUTO_TIE))
    if (batch, context, alpha) == points[0]:
      assert table[shortest - 1][1] < 1 + autotune.AUTO_MARGIN <= best, table    # the case the rule is about
    tree, info = autotune.choose(cfg, spec, batch, context, want_tree=False, hardware=hw, alpha=alpha, max_gamma=3,
                                 allow_autoregressive=True)
    want = 0 if best < 1 + autotune.AUTO_MARGIN else shortest
    assert (tree.max_depth if info["speculate"] else 0) == want, (batch, context, alpha, table)
