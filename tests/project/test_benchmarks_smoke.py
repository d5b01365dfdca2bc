"""Every benchmark's `--smoke` mode (random tiny model, tiny shapes): `python -m benchmarks.GROUP.NAME --smoke --output
TMP` runs (in this process through `main(argv)`; the GPU harness in a subprocess: it reroutes the decode loop's
accept) and its JSON has the promised fields with sane values, checked against independent references where a
benchmark computes something (numpy margins, plain decoding's tokens, the simulated acceptance's closed form,
row-round counts, the all-reduce prediction recomputed). Seconds to minutes each; the slower ones are marked slow.
"""
import ast
import re
import importlib
import json
import pathlib
import subprocess
import sys
import types

import jax.numpy as jnp
import numpy as np
import pytest

import magicdec_jax as md
from magicdec_jax import constraints, feature_head, testing
from magicdec_jax.model import full_forward
from magicdec_jax.trees import Tree

from conftest import random_prompts

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = {}      # case -> (module, check(doc, out, module, stdout), slow, extra argv, in a subprocess)


def case(name: str, slow: bool = True, extra: tuple = (), in_subprocess: bool = False):
  """Register `check` as the smoke check of benchmarks.<name> (a module; "MODULE:STUDY" passes STUDY first;
  "MODULE#TAG" names a second case of one module)."""
  def register(check):
    module, _, study = name.partition("#")[0].partition(":")
    CASES[name] = (module, check, slow, ((study,) if study else ()) + extra, in_subprocess)
    return check
  return register


def _env_ok(doc):
  assert doc["env"]["device"] and doc["env"]["jax_version"] and doc["env"]["date"] and doc["env"]["loadavg_start"]


@case("decode.auto_vs_sweep")
def _auto_vs_sweep(doc, out, mod, stdout):
  """Calibrates first, then every auto pick is run; --rescore resolves the picks again, runs untouched."""
  _env_ok(doc)
  assert doc["profile"]["holdout_rel_err"]["method"] == "leave-one-out"
  (shape,) = doc["shapes"]
  assert {"autoregressive", "gamma1", "gamma2", "sequoia16"} <= set(shape["runs"])
  picks = shape["auto_picks"]
  assert picks["auto_gamma"]["chain"] and picks["auto_tree"]["nodes"] >= 1
  assert all(p["measured_by"] in shape["runs"] for p in picks.values()), picks   # every pick was run
  s = shape["summary"]
  for k in ("best_gamma", "auto_gamma", "auto_gamma_over_best", "best_shipped_tree", "auto_tree_over_best_shipped",
            "auto_gamma_over_best_of_sweep", "auto_tree_over_best_of_sweep"):
    assert k in s, k
  assert all(r["identical_to_ar"] for name, r in shape["runs"].items() if name != "autoregressive")
  assert out.with_suffix(".profile.json").exists()
  again = out.parent / "rescored.json"
  mod.main(["--smoke", "--rescore", str(out), "--output", str(again)])
  re = json.loads(again.read_text())
  assert re["rescored"]["from"] == out.name and re["shapes"][0]["runs"] == shape["runs"]   # runs untouched
  assert "auto_gamma_over_best_of_sweep" in re["shapes"][0]["summary"]


@case("decode.datagen")
def _datagen_throughput(doc, out, mod, stdout):
  """Every configuration (6 prompts x 2 samples, 2 slots) and the merge: static and continuous batching give
  the same samples, and the utilization figures agree with the row-round counts."""
  assert out.with_suffix(".png").stat().st_size > 0
  assert set(doc["configs"]) == set(mod.CONFIGS)
  for c in doc["configs"].values():
    assert c["samples"] == 12 and c["useful_tokens_per_s"] > 0 and 0 <= c["prefill_share"] < 1
    assert c["slot_utilization"] == c["active_row_rounds"] / c["row_rounds"]
    assert c["row_rounds"] == 2 * c["rounds"]                         # 2 slots every round
    assert c["active_row_rounds"] == c["sample_verify_steps"]         # = the rows' own round counters
  for m in ("ar", "streaming"):
    s = doc["summary"][m]
    assert s["same_outputs"] and s["bound"] >= 1.0 and s["speedup"] > 0


@case("decode.context_sweep")
def _context_sweep(doc, out, mod, stdout):
  """Every speculative point decodes AR's tokens; --repredict keeps the measured figures; --combine merges."""
  assert doc["env"]["device"] and doc["env"]["date"] and len(doc["points"]) == 4
  for p in doc["points"]:
    assert all(f["identical_to_ar"] for f in p["spec"])
    assert p["ar"]["decode_tok_s"] > 0 and p["best_decode_speedup"] > 0
  assert set(doc["crossover"]) == {"1", "2"}
  assert doc["crossover"]["1"]["label"].startswith("predicted")
  assert out.with_suffix(".png").exists()
  mod.main(["--smoke", "--repredict", str(out)])          # predictions only, measured figures kept
  again = json.loads(out.read_text())
  assert again["points"] == doc["points"]
  assert again["crossover"]["2"]["predicted_with_profile"]["label"].startswith("predicted")
  both = out.parent / "both.png"
  table = mod.combine([str(out), str(out)], str(both))   # two runs, one figure
  assert table[2][128] == [p["best_decode_speedup"] for p in doc["points"] if (p["batch"], p["context"]) == (2, 128)] * 2
  assert both.read_bytes()[:4] == b"\x89PNG"


@case("decode.long_output")
def _long_output(doc, out, mod, stdout):
  """Every setting ran all rows to the end; the figures recomputed from the recorded (time, tokens) series
  with numpy's interpolation; the forced schedule's switches (2 -> plain -> 1) at their contexts."""
  _env_ok(doc)
  b, new = doc["batch"], doc["new"]
  for name, r in doc["runs"].items():
    assert r["new_tokens"] == b * new
    assert abs(r["tokens_per_s"] - b * new / r["decode_s"]) < 1e-6 * r["tokens_per_s"]
    t, n = np.array([x[0] for x in r["records"]]), np.array([x[1] for x in r["records"]])
    for s in doc["segments"]:
      lo, hi = s["tokens"]
      want = b * (hi - lo) / (np.interp(hi, n, t) - np.interp(lo, n, t))
      assert abs(s["tokens_per_s"][name] - want) < 1e-6 * want
  tps = doc["tokens_per_s"]
  assert abs(doc["adaptive_speedup"] - tps["adaptive"] / tps["plain"]) < 1e-9
  assert abs(doc["adaptive_vs_best_fixed"] - tps["adaptive"] / max(v for k, v in tps.items() if not k.startswith("adaptive"))) < 1e-9
  mw = doc["matched_window"]
  k = mw["chunks"]
  assert k == min(len(r["records"]) - 1 for r in doc["runs"].values())
  for name, r in doc["runs"].items():
    assert abs(mw["tokens_per_s"][name] - b * r["records"][k][1] / r["records"][k][0]) < 1e-6 * mw["tokens_per_s"][name]
  sw = doc["runs"]["adaptive"]["schedule"]["switches"]
  assert [x["setting"] for x in sw[:3]] == ["gamma=2", "plain", "gamma=1"]
  assert 100 <= sw[1]["context"] < 130 <= sw[2]["context"]
  assert {s["adaptive_setting"]["adaptive"] for s in doc["segments"]} <= {"gamma=2", "plain", "gamma=1"}
  assert pathlib.Path(doc["png"]).exists()


@case("steps.round_cost")
def _round_cost(doc, out, mod, stdout):
  (row,) = doc["rows"]
  (g,) = row["gammas"]
  assert row["ar_in_loop_s"] > 0 and g["round_in_loop_s"] > 0 and g["sum_of_steps_s"] > 0


@case("decode.compare:identity", slow=False)
def _identity(doc, out, mod, stdout):
  """The chain's and the tree's rows are plain decoding's tokens (the tiny model's head dim of 8 is below
  what log-prob bits are promised at: docs/decisions.md#cpu-opt-preset, so those are only counted); the
  comparison itself on two hand-made rows."""
  _env_ok(doc)
  assert set(doc["runs"]) == {"chain3", "sequoia16"} and doc["lengths"] == [40, 9]
  for r in doc["runs"].values():
    assert r["rows"] == r["tokens_equal_rows"] == 2 and 0 <= r["logprob_bits_equal_rows"] <= 2
    assert 0 <= r["max_logprob_diff"] < 1e-4
  a = types.SimpleNamespace(tokens=[[1, 2], [3]], logprobs=[np.float32([-0.5, -1.0]), np.float32([-2.0])])
  b = types.SimpleNamespace(tokens=[[1, 2], [4]], logprobs=[np.float32([-0.5, -1.25]), np.float32([-2.0])])
  assert mod.compared(a, b) == {"rows": 2, "tokens_equal_rows": 1, "logprob_bits_equal_rows": 1,
                                "max_logprob_diff": 0.25}


@case("steps.prefill", slow=False, extra=("--numerics", "fast", "--prefill-tiles", "8x16", "--prefill-options",
                                         "swl=xla_disable_hlo_passes:simplify-while-loops"))
def _prefill_bench(doc, out, mod, stdout):
  assert doc["engine"]["tokens_per_s"] > 0 and doc["previous_rule"]["tokens_per_s"] > 0
  assert 0 < doc["engine"]["share_of_matmul_rate"]
  assert set(doc["by_numerics"]) == {"fast", "invariant_tile8x16", "invariant_swl"}
  assert all(r["tokens_per_s"] > 0 and len(r["times"]) == 1 for r in doc["by_numerics"].values())


@case("steps.families", slow=False, extra=("--families", "llama,qwen3,gemma3", "--full_cache"))
def _families_step(doc, out, mod, stdout):
  """Each family timed every round; its bytes counted by hand from the shape (every weight of a tied
  LLaMA layer stack, Qwen3's two q/k norm vectors per layer, the float32 K and V up to the context), so
  bytes_per_s is those bytes over the fastest step; Gemma 3 over rings and over a full cache."""
  _env_ok(doc)
  s, b, n = doc["shape"], doc["batch"], doc["context"]
  dm, f, v, nl, h, kh, d = (s[k] for k in ("hidden_size", "intermediate_size", "vocab_size", "num_layers",
                                          "num_heads", "num_kv_heads", "head_dim"))
  layer = dm * h * d + 2 * dm * kh * d + h * d * dm + 3 * dm * f + 2 * dm
  llama = 4 * (nl * layer + v * dm + dm) + 4 * 2 * nl * b * kh * n * d
  runs = doc["runs"]
  assert runs["llama"]["bytes"] == llama and runs["qwen3"]["bytes"] == llama + 4 * nl * 2 * d
  for r in runs.values():
    assert len(r["times"]) == doc["rounds"] * doc["repeats"] and r["seconds"] == min(r["times"]) > 0
    assert r["bytes_per_s"] == pytest.approx(r["bytes"] / r["seconds"])
  assert doc["speed_per_byte_vs_llama"]["llama"] == 1.0 and doc["speed_per_byte_vs_llama"]["qwen3"] > 0
  assert runs["gemma3"]["cache"] == "rings" and runs["gemma3+full"]["cache"] == "full"
  assert set(doc["ring_speedup_vs_full_cache"]) == {"gemma3"} and doc["ring_speedup_vs_full_cache"]["gemma3"] > 0


def _rows(doc):
  """(point, name -> the setting's figures) of a compare study's only point."""
  (point,) = doc["points"]
  return point, point["settings"]


def _speedups_follow(rows, ref):
  for name, r in rows.items():
    base = rows[name.rsplit("/", 1)[0] + "/" + ref]
    assert r["speedup"] == pytest.approx(r["tokens_per_s"] / base["tokens_per_s"])
    assert r["tokens_per_s"] > 0 and r["ms_per_round"] > 0


@case("decode.compare:quantized", extra=("--seeds", "2"))
def _quantized(doc, out, mod, stdout):
  """Every weight copy drafts and is timed; greedy speculative tokens equal plain decoding's whatever the draft's
  weights; sampled acceptance is the mean of the seeds' runs."""
  _env_ok(doc)
  assert set(doc["draft_step"]) == {"bfloat16", "int8", "int4"}
  assert all(v["median_ms"] > 0 for v in doc["draft_step"].values())
  point, rows = _rows(doc)
  _speedups_follow(rows, "plain")
  for w in ("bfloat16", "int8", "int4"):
    assert rows[f"greedy/{w}"]["rows_identical_to_plain"] == point["batch"]
    r = rows[f"t0.8-topp0.95/{w}"]
    assert len(r["acceptance_by_seed"]) == 2 and r["acceptance_rate"] == pytest.approx(np.mean(r["acceptance_by_seed"]))


@case("decode.compare:numerics", slow=False)
def _numerics(doc, out, mod, stdout):
  """Both numerics decode; with fixed-shape numerics MagicDec's tokens are plain decoding's in every row."""
  _env_ok(doc)
  point, rows = _rows(doc)
  _speedups_follow(rows, "plain")
  assert rows["invariant/magicdec"]["rows_identical_to_plain"] == point["batch"]
  assert set(point["cost_fast_over_invariant"]) == {"plain", "magicdec"}


@case("decode.compare:lookup", slow=False)
def _lookup(doc, out, mod, stdout):
  """Greedy: the self-draft and every lookup chain decode plain decoding's tokens (the demo's prompts)."""
  point, rows = _rows(doc)
  assert set(rows) == {"all/plain", "all/self_gamma2", "all/lookup_gamma2"}
  assert all(r["rows_identical_to_plain"] == point["batch"] for r in rows.values())
  _speedups_follow(rows, "plain")


@case("decode.compare:sampling")
def _sampling(doc, out, mod, stdout):
  """Invariant sampling's speculative samples equal plain decoding's; both modes measured."""
  point, rows = _rows(doc)
  assert rows["t0.8/invariant/magicdec"]["rows_identical_to_plain"] == point["batch"]
  assert 0 <= rows["t0.8/rejection/magicdec"]["acceptance_rate"] <= 1
  _speedups_follow(rows, "plain")


@case("decode.compare:filters")
def _filters(doc, out, mod, stdout):
  """The sort-free filter keeps the tokens the sorted definition keeps; every setting decodes."""
  assert doc["filter"] and all(f["same_kept_set"] and f["max_abs_prob_diff"] < 1e-5 for f in doc["filter"])
  point, rows = _rows(doc)
  assert {n.split("/")[0] for n in rows} == set(mod.FILTERS)
  assert rows["greedy/magicdec"]["rows_identical_to_plain"] == point["batch"]
  _speedups_follow(rows, "plain")


@case("decode.compare:logprobs")
def _logprobs(doc, out, mod, stdout):
  """Logprobs off / on / top-5 for every (sampling, decoder); the tokens never change with them."""
  point, rows = _rows(doc)
  assert len(rows) == 12 and all(r["rows_identical_to_off"] == point["batch"] for r in rows.values())
  _speedups_follow(rows, "off")


@case("decode.compare:mixed")
def _mixed(doc, out, mod, stdout):
  """The three settings ran; the mixed batch's greedy rows are the greedy run's (the reference)."""
  point, rows = _rows(doc)
  assert set(rows) == {"all/greedy", "all/sampled", "all/mixed"}
  assert point["mixed_greedy_rows_equal_greedy_run"] and point["mixed_over_slower_uniform"] > 0


@case("decode.compare:trees")
def _trees(doc, out, mod, stdout):
  """Greedy: the chain and the Sequoia tree decode plain decoding's tokens."""
  point, rows = _rows(doc)
  assert {"t0.0/chain4", "t0.0/sequoia16", "t0.8/sequoia16"} <= set(rows)
  assert all(r["rows_identical_to_plain"] == point["batch"] for n, r in rows.items() if n.startswith("t0.0"))


@case("decode.compare:shrink", slow=False)
def _shrink(doc, out, mod, stdout):
  """The shrinking batch decodes plain decoding's tokens and really runs in stages."""
  point, rows = _rows(doc)
  assert rows["all/shrinking"]["rows_identical_to_plain"] == point["batch"] == rows["all/fixed"]["rows_identical_to_plain"]
  assert len(rows["all/shrinking"]["batch_stages"]) >= 1


@case("drafts.acceptance", extra=("--parts", "drafts,window"))
def _acceptance(doc, out, mod, stdout):
  """Every draft kind, greedy and sampled: greedy tokens are plain decoding's; the per-position acceptance adds up
  to the mean accepted length; alpha is the chain estimate recomputed here; the teacher-forced table counts
  the positions past sink + window."""
  _env_ok(doc)
  d = doc["drafts"]
  assert set(d["kinds"]) == {"streaming", "snapkv", "model", "int8", "int4"}
  for kind in d["kinds"].values():
    assert kind["greedy"]["rows_identical_to_plain"] == d["batch"]
    for s in ("greedy", "t0.8-topp0.95"):
      r = kind[s]
      p = np.asarray(r["per_position_acceptance"])
      assert len(p) == d["gamma"] and np.all(np.diff(p) <= 1e-9)          # position k needs k - 1 accepted
      assert p.sum() == pytest.approx(r["mean_accepted_length"] - 1)
      assert r["alpha"] == pytest.approx(p.sum() / (1 + p[:-1].sum()))
  for row in doc["teacher_forced"]:
    assert row["positions"] == row["context"] - 1 - row["sink"] - row["window"] and 0 <= row["alpha"] <= 1


@case("drafts.acceptance#ceiling", slow=False, extra=("--parts", "ceiling"))
def _acceptance_ceiling(doc, out, mod, stdout):
  """Its margin statistic against numpy on the same logits recomputed independently (a plain full forward)."""
  model = testing.random_tiny_model(0)
  ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (2, 64))
  lg = np.asarray(full_forward(model.params, model.config, jnp.asarray(ids, jnp.int32)), np.float64)
  lg = lg.reshape(-1, lg.shape[-1])
  p = np.exp(lg - lg.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  s = np.sort(p, -1)
  doc = doc["ceiling"]
  assert doc["positions"] == 128
  assert abs(doc["target_top1_prob"]["mean"] - s[:, -1].mean()) < 1e-4
  assert abs(doc["top1_over_top2_below"]["2.0"] - np.mean(s[:, -1] / s[:, -2] < 2.0)) <= 1 / 128
  assert 0 <= doc["truncated_target_agreement"]["1"] <= 1


@case("drafts.trained_speed")
def _trained_speed(doc, out, mod, stdout):
  """A 1-layer draft cut from the tiny target and a random feature head: chains and a tree from one prefill,
  each equal to plain decoding (greedy); the head's step costs."""
  _env_ok(doc)
  assert doc["draft_layers"] == 1 and doc["target_layers"] == 2
  assert doc["steps"]["feature_step_s"] > 0 and doc["steps"]["by_context"][0]["feature_over_ar"] > 0
  (shape,) = doc["shapes"]
  runs = shape["runs"]
  assert set(runs) == {"plain", "self_gamma2", "model_gamma2", "feature_gamma2", "feature_tree2-1"}
  assert runs["feature_tree2-1"]["tree_parents"] == [-1, 0, 0, 1]
  for name, run in runs.items():
    assert run["tokens_per_s"] > 0
    if name != "plain":
      assert run["identical_to_ar"], name
      assert 1.0 <= run["mean_accepted_length"] <= 3.0


def _decodes_like_plain(draft) -> None:
  """The trained draft on the random tiny target gives a plain autoregressive run's greedy tokens."""
  target = testing.random_tiny_model(0)
  prompts = random_prompts((9, 20), target.config.vocab_size, seed=6)
  ar = md.generate(target, prompts, max_new_tokens=10)
  assert md.generate(target, prompts, max_new_tokens=10, gamma=2, draft=draft).tokens == ar.tokens


def _train_run(doc):
  _env_ok(doc)
  assert doc["target"] == "random-tiny (float32)"
  assert doc["train_tokens"] == doc["train_windows"] * doc["config"]["seq_len"] == doc["train_windows"] * 32
  assert [h["step"] for h in doc["curve"]] == [0, 1, 2]
  assert "the last 1 play(s)" in doc["heldout"]["source"]


@case("drafts.train:model")
def _train_model(doc, out, mod, stdout):
  """Two distillation steps: the curve's bookkeeping, and the draft written decodes the target's own tokens."""
  _train_run(doc)
  assert all(0 <= h["acceptance"] <= 1 for h in doc["curve"])
  _decodes_like_plain(md.ModelDraft(md.load_model(doc["config"]["out_dir"]), sink=2, window=8))


@case("drafts.train:feature")
def _train_feature(doc, out, mod, stdout):
  """Two feature-head steps over a 65-token draft vocabulary: finished, and the head written drafts losslessly."""
  _train_run(doc)
  assert doc["finished"] and doc["draft_vocab"]["size"] == 65
  assert all(len(h["acceptance"]) == 3 and all(0 <= x <= 1 for x in h["acceptance"]) for h in doc["curve"])
  _decodes_like_plain(md.FeatureDraft(feature_head.load_head(doc["config"]["out_dir"]), sink=2, window=8))


@case("drafts.train:step")
def _train_step(doc, out, mod, stdout):
  """One training step in float32 and bfloat16 compute from the same head and batches: the same first loss
  within bfloat16's rounding, and the ratio is the medians' quotient."""
  _env_ok(doc)
  f32, bf16 = doc["results"]["float32"], doc["results"]["bfloat16"]
  assert len(f32["times_s"]) == len(bf16["times_s"]) == 2 and f32["median_s"] > 0 and bf16["median_s"] > 0
  assert all(np.isfinite(f32["loss"])) and all(np.isfinite(bf16["loss"]))
  assert abs(bf16["loss"][0] - f32["loss"][0]) <= 0.02 * abs(f32["loss"][0])
  assert doc["speedup_bfloat16_over_float32"] == pytest.approx(f32["median_s"] / bf16["median_s"])


@case("constraints.decode", slow=False)
def _constraint_decode(doc, out, mod, stdout):
  """Four decodes per sampling, the goals' ratios are the tokens/s quotients, greedy MagicDec equals plain
  decoding under the constraint, and every constrained output keeps the schema's automaton alive."""
  _env_ok(doc)
  assert set(doc["samplings"]) == set(mod.SAMPLINGS)
  for name, row in doc["samplings"].items():
    tps = {k: row[k]["tokens_per_s"] for k in ("plain", "magicdec", "plain_constrained", "magicdec_constrained")}
    assert all(v > 0 for v in tps.values())
    assert row["constrained_over_unconstrained_magicdec"] == round(tps["magicdec_constrained"] / tps["magicdec"], 3)
    assert row["valid_prefixes"], name
  assert doc["samplings"]["greedy"]["identical_constrained"]


@case("constraints.compile", slow=False)
def _constraint_compile(doc, out, mod, stdout):
  """States and classes are the public compile's (a cached compile of the same schema over the same byte
  tokenizer); the table's shape is the power-of-two bucket of the automata's sums."""
  _env_ok(doc)
  vocab = constraints.token_vocabulary(testing.byte_tokenizer(), [256], 264)
  states, classes = 0, 0
  for name, schema in (("four_fields", mod.FOUR_FIELDS), ("six_fields", mod.many_fields(6))):
    a = constraints.compile_constraint(constraints.Constraint.json_schema(schema), vocab)
    row = doc["schemas"][name]
    assert (row["states"], row["classes"]) == (a.num_states, a.num_classes)
    assert row["automaton_bytes"] == a.nbytes and 0 < row["outlines_index_s"] and 0 < row["compile_s"]
    states, classes = states + a.num_states, max(classes, a.num_classes)
  assert doc["table"]["shape"] == [4, 1 << (states + 1).bit_length(), 1 << (classes - 1).bit_length()]
  assert doc["allowed_mask"]["ms"] > 0 and doc["cache_hit_us"] > 0


# slow: the harness compiles every configuration of every part (minutes of CPU)
@case("gpu.harness", extra=("--parts", "all"), in_subprocess=True)
def _gpu_harness(doc, out, mod, stdout):
  """Every part runs through the engine's loop: the simulated acceptance drives it (a row's rounds against its
  tokens), the paper table's speedups and predicted all-reduces follow from the runs' figures and the assumed
  constants, the acceptance comes from the CPU measurement, the stream and the tree report, the identity
  part's tokens equal plain decoding's; one JSON and its log."""
  _env_ok(doc)
  assert doc["bandwidth"]["copy_bytes_per_s"] > 0 and out.with_suffix(".log").read_text().count("\n") > 10
  assert not [r for r in doc["runs"] if "error" in r or "skipped" in r]
  assert not [p for p, v in doc["parts"].items() if "error" in v], doc["parts"]
  runs = {r["label"]: r for r in doc["runs"]}
  for r in doc["runs"]:
    assert r["tok_per_s"] > 0 and r["loop_rounds_N2"] >= r["row_rounds_N2"] > 0
    if r["gamma"] == 0:
      assert r["loop_rounds_N2"] == r["tokens_N2"] // r["batch"]             # one token a round
    elif r["alpha"] >= 0.5:
      assert r["tokens_N2"] / r["batch"] / r["row_rounds_N2"] > 1.3           # the simulated acceptance drives it
  acc = json.loads((ROOT / "benchmarks" / "results" / doc["alphas"]["self"]["source"].split(" ")[0]).read_text())
  assert doc["alphas"]["snapkv"]["alpha"] == acc["drafts"]["kinds"]["snapkv"]["greedy"]["alpha"]
  paper = doc["parts"]["paper"]
  tp, cfg = paper["shard"]["tp"], paper["shard"]["target"]
  ar_s = lambda cfg, b, t: 2 * cfg["num_layers"] * (12e-6 + 2 * (tp - 1) / tp * b * t * cfg["hidden_size"] * 2 / 360e9)
  assert len(paper["table"]) >= 4 and set(paper["floors"]) == set(paper["table"])
  for key, ent in paper["table"].items():
    ar = runs[f"{key} AR"]
    for label, row in ent.items():
      r = runs[f"{key} {label}"]
      assert row["speedup"] == pytest.approx(r["tok_per_s"] / ar["tok_per_s"])
      dcfg = paper["shard"]["draft_1b"] if label.startswith("1B") else cfg
      g, b = r["gamma"], r["batch"]
      comm = g * ar_s(dcfg, b, 1) + ar_s(cfg, b, g + 1)
      want = (r["tokens_N2"] / b) * (ar["ms_per_loop_round"] / 1e3 + ar_s(cfg, b, 1)) / (
          r["loop_rounds_N2"] * (r["ms_per_loop_round"] / 1e3 + comm))
      assert row["speedup_with_allreduce_predicted"] == pytest.approx(want)
  assert {r["kind"] for r in doc["runs"] if r.get("kind")} == {"self", "snapkv", "1B", "self int8", "self int4"}
  s = doc["parts"]["stream"]["stream"]
  assert s["results"] == s["requests"] == 8 + 4 and s["new_tokens"] == s["results"] * doc["N2"]
  assert s["steady_state_tokens_per_s"] == pytest.approx(s["new_tokens"] / s["decode_s"] / s["slot_utilization"])
  t = runs["8x96 self sequoia6"]
  assert t["tree_nodes"] == 6 and doc["parts"]["tree"]["tree_over_best_chain"]["ratio"] > 0
  ident = doc["parts"]["identity"]
  assert ident["invariant"]["rows_identical"] == ident["invariant"]["rows"]
  assert set(ident["cost"]) == {"AR step", "chain-3 round"}                  # invariant on the kernel against fast
  assert runs["identity AR invariant"]["fixed_attention"] == ident["fixed_shapes"]["attention"] == "pallas_interpret"
  assert "floor" in doc["parts"]["headline"] and "batch1" in doc["parts"]["batch1"]


def test_simulated_acceptance_matches_its_definition():
  """The Bernoulli switch on a large sample: a chain's per-position conditional acceptance ~ alpha; the mean
  accepted length of a chain and of a Sequoia tree ~ the closed form tree.expected_tokens(vector) - 1."""
  from benchmarks.gpu import simulate
  from magicdec_jax import trees
  for alpha in (0.7, 0.8):
    chk = simulate.check(alpha)
    assert abs(chk["conditional_acceptance"] - alpha) < 0.02, chk
    assert abs(chk["mean_accepted"] - Tree.chain(4).expected_tokens((alpha,)) + 1) < 0.05, chk
  vec = simulate.default_vector(0.8)
  chk = simulate.check(0.8, tree=trees.sequoia_tree(vec, 16, 8), vector=vec)
  assert abs(chk["mean_accepted"] - chk["expected_mean_accepted"]) < 0.1, chk


def test_simulated_acceptance_plan_field_drives_the_loop():
  """DecodeSettings.simulated_acceptance replaces each round's outcome in the compiled loop: (1.0,) accepts
  every drafted token, (0.0,) none, whatever the random weights would have; plain decoding refuses it."""
  model = testing.random_tiny_model(0)
  prompts = [[1, 2, 3, 4, 5, 6, 7, 8] * 4] * 2
  for v, rate in (((1.0,), 1.0), ((0.0,), 0.0)):
    r = md.generate(model, prompts, max_new_tokens=17, draft=md.StreamingDraft(2, 8), gamma=3,
                    simulated_acceptance=v)
    assert r.stats["acceptance_rate"] == rate, (v, r.stats)
  with pytest.raises(ValueError, match="simulated_acceptance needs a draft"):
    md.generate(model, prompts, max_new_tokens=4, simulated_acceptance=(0.5,))


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if c[2] else []) for n, c in CASES.items()])
def test_benchmark_smoke(name, tmp_path, capsys):
  module, check, _, extra, in_subprocess = CASES[name]
  out = tmp_path / f"{name.replace(':', '_')}.json"
  argv = [*extra, "--smoke", "--output", str(out)]
  mod = importlib.import_module(f"benchmarks.{module}")
  if in_subprocess:
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stdout = proc.stdout
  else:
    mod.main(argv)
    stdout = capsys.readouterr().out
  check(json.loads(out.read_text()), out, mod, stdout)


def test_every_smoke_mode_is_run():
  """The benchmarks whose usage shows `--smoke` are exactly those run above, and every study of
  decode.compare has a case."""
  smoke = {".".join(p.relative_to(ROOT / "benchmarks").with_suffix("").parts)
           for p in (ROOT / "benchmarks").rglob("*.py")
           if "--smoke" in (ast.get_docstring(ast.parse(p.read_text())) or "") and p.stem not in ("common", "__init__")}
  assert smoke == {c[0] for c in CASES.values()}
  compare = importlib.import_module("benchmarks.decode.compare")
  assert {n.partition(":")[2] for n in CASES if n.startswith("decode.compare:")} == set(compare.STUDIES)


def _expand(spec: str) -> list[str]:
  """'a_{x,y}.json' -> ['a_x.json', 'a_y.json'] (any number of brace groups)."""
  m = re.search(r"\{([^{}]*)\}", spec)
  if not m:
    return [spec]
  return [x for alt in m.group(1).split(",") for x in _expand(spec[:m.start()] + alt + spec[m.end():])]


def test_results_index_lists_exactly_the_kept_files():
  """benchmarks/results/INDEX.md names every file in benchmarks/results/ once, and nothing else; every result file
  the docs, the README or the package name in full is there."""
  res = ROOT / "benchmarks" / "results"
  listed = []
  for line in (res / "INDEX.md").read_text().splitlines():
    if line.startswith("| `"):
      for spec in line.split("|")[1].strip().strip("`").split("`, `"):
        listed += _expand(spec)
  on_disk = {str(p.relative_to(res)) for p in res.rglob("*") if p.is_file()} - {"INDEX.md"}
  assert len(listed) == len(set(listed)), "listed twice: " + str({x for x in listed if listed.count(x) > 1})
  assert set(listed) == on_disk, (set(listed) - on_disk, on_disk - set(listed))
  texts = [p.read_text() for p in [*(ROOT / "docs").glob("*.md"), ROOT / "README.md", *(ROOT / "magicdec_jax").rglob("*.py")]]
  named = {m for t in texts for m in re.findall(r"(?<![\w.{,*/-])([a-z0-9][\w+.-]*_(?:cpu|h100|h200)[\w+.-]*\.(?:json|png|log|txt))\b", t)}
  assert named and not [n for n in named if n not in on_disk and not n.startswith(("context_sweep_cpu_2026-11-23_z",))], \
      sorted(n for n in named if n not in on_disk)


def test_a_benchmark_varies_a_quantized_copys_form_through_the_draft():
  """common.QuantFormDraft: the copy is made in the draft's QuantForm (here all-int4, groups of 32,
  symmetric), once, and drafting on it still decodes plain decoding's greedy tokens; the backend's form and
  every module attribute are left as they were."""
  import jax
  import magicdec_jax as md
  from benchmarks import common
  from magicdec_jax.layers import quant
  from conftest import tiny_model

  before = quant.backend_form()
  form = common.int4_form(group=32, keep_int8=(), symmetric=True)
  assert (form.group, form.keep_int8, form.offsets) == (32, (), False)
  draft = common.QuantFormDraft(2, 8, weights="int4", form=form)
  model = tiny_model(3, attn_scale=8.0, hidden=64)
  copy = draft.params(model)
  assert draft.params(model) is copy
  isq = lambda x: isinstance(x, quant.QuantizedWeight)
  leaves = [x for x in jax.tree.leaves(copy, is_leaf=isq) if isq(x)]
  assert {x.kind for x in leaves} == {"int4"} and all(x.offset is None for x in leaves)
  prompts = random_prompts([40, 23], model.config.vocab_size, seed=7)
  want = md.generate(model, prompts, max_new_tokens=8).tokens
  assert md.generate(model, prompts, max_new_tokens=8, draft=draft, gamma=2).tokens == want
  assert quant.backend_form() == before
