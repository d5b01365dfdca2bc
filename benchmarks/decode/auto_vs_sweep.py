"""Does `gamma="auto"` / `tree="auto"` pick what a sweep finds fastest? SmolLM2-135M, greedy, StreamingDraft, CPU.

Per batch x context shape (Shakespeare prompts, prefilled once: prefilled.py): autoregressive decoding, a sweep
of gammas and of every shipped tree, all from copies of the same caches (compile seconds excluded), and the
picks `autotune.choose` makes as generate does (a fitted hardware profile, a measured acceptance vector); a
pick in the sweep is measured by that run, any other is run too. Records tokens/s, auto / best-of-sweep
ratios, whether outputs equal autoregressive ones, the profile's leave-one-out step-time error, and beside
each speedup the cost model's predicted one (at auto's acceptance vector and at the measured acceptance).
The JSON is rewritten after every configuration.

  nice -n 0 python -m benchmarks.decode.auto_vs_sweep \
      --profile benchmarks/results/cpu_profile_smollm2_streaming4+128_2026-11-23.json
  python -m benchmarks.decode.auto_vs_sweep                  # no --profile: calibrates first (a few minutes)
  python -m benchmarks.decode.auto_vs_sweep --smoke          # random tiny model, calibrating first (about a minute)
"""
from __future__ import annotations

import argparse
import json
import os
import time

from benchmarks import common
from magicdec_jax import StreamingDraft, prefilled, trees
from magicdec_jax.measure import calibrate
from magicdec_jax.tuning import autotune, costmodel, profiles

DEFAULT_VECTOR = os.path.join(common.RESULTS_DIR, "acceptance_vector_smollm2_streaming4+128_cpu_2026-11-22.json")


def main(argv=None):
  ap = common.parser(__doc__, smoke="random tiny model, tiny shapes: checks the script (CPU, s)")
  ap.add_argument("--shapes", type=common.shape_list, default=[(4, 1024), (8, 1024), (8, 2048)])
  common.flags(ap, max_new=48, sink=4, window=128)
  ap.add_argument("--gammas", type=common.int_list, default=[1, 2, 3, 4, 5, 6])
  ap.add_argument("--trees", default=",".join(n for n in trees.DEFAULT_TREE_NAMES if not n.startswith("chain")),
                  help="shipped trees to sweep (the shipped chains are in the gamma sweep)")
  ap.add_argument("--profile", default=None, help="hardware profile JSON (default: calibrate here first)")
  ap.add_argument("--acceptance", default=DEFAULT_VECTOR, help="acceptance vector JSON for auto")
  ap.add_argument("--budget-min", type=float, default=60.0, help="start no new configuration after this")
  ap.add_argument("--rescore", default=None, metavar="RESULT_JSON",
                  help="measure nothing: resolve auto again for a recorded run (see rescore()) -> --output")
  args = common.parse(ap, argv, shapes=[(2, 64)], max_new=8, gammas=[1, 2], trees="sequoia16", window=16)
  if args.rescore:
    return rescore(args.rescore, args.output, args.smoke)
  t_start = time.time()
  out_path = common.output_path(args.output, "auto_vs_sweep")
  model, source = common.model(args.smoke)
  draft = StreamingDraft(sink=args.sink, window=args.window)
  vec = common.read_json(args.acceptance)["acceptance_vector"]
  doc = common.record("auto_vs_sweep", source, model.config.dtype, greedy=True, max_new_tokens=args.max_new,
                      draft={"kind": "StreamingDraft", "sink": args.sink, "window": args.window},
                      acceptance_file=args.acceptance, acceptance_vector=vec, args=dict(vars(args)), shapes=[],
                      goal="auto >= 95% of the best swept tokens/s; fitted step-time error <= 10% held out")
  if args.profile is None:
    common.log("[auto_vs_sweep] calibrating (no --profile) ...")
    grid = (dict(batches=(1, 2), contexts=(64, 128), tokens=(1, 4), repeats=1, passes=1) if args.smoke else
            dict(batches=(1, 4, 8), contexts=(512, 1024, 2048), tokens=(1, 4, 16, 32), repeats=2, passes=2))
    prof = calibrate.calibrate(model.params, model.config, model_name=source, acceptance_vector=vec,
                               drafts=[calibrate.DraftUnderTest("self", args.sink + args.window)], **grid)
    args.profile = os.path.splitext(out_path)[0] + ".profile.json"
    profiles.save_profile(prof, args.profile)
  _, prof = profiles.load_profile(args.profile)
  doc["profile"] = {"path": args.profile, "device": prof.get("device"), "date": prof.get("date"),
                    "holdout_rel_err": prof["fit"].get("holdout_rel_err"),
                    "train_rel_err": prof["fit"].get("train_rel_err"),
                    "coef": dict(zip(prof["fit"]["features"], prof["fit"]["coef"]))}

  def save():
    doc["env"]["loadavg_now"] = list(os.getloadavg())
    doc["elapsed_s"] = time.time() - t_start
    common.write_json(doc, out_path, stamp=False)

  hw = autotune.detect_hardware(args.profile)
  draft_cost = autotune.cost_draft(draft)

  def one(pre, **kw):
    if (time.time() - t_start) / 60 > args.budget_min:
      return None
    load = os.getloadavg()[0]
    res = prefilled.decode(model, pre, eos_token_id=[], **kw)
    return res, dict({k: res.stats.get(k) for k in ("tokens_per_s", "decode_s", "compile_s", "mean_accepted_length",
                                                    "tree_nodes", "acceptance_rate")}, loadavg_1min_before=load)

  def predictions(tree, b: int, context: int, measured_tokens_per_round: float) -> dict:
    """The cost model's speedup for `tree` (labelled predictions): with auto's acceptance vector, and with the
    measured tokens per round in place of the vector's expectation."""
    t_round = sum(costmodel.t_draft(model.config, hw, draft_cost, b, context, int(w), model.config.dtype)
                  for w in tree.expanding_per_level)
    t_round += costmodel.t_verify(model.config, hw, b, context, tree.num_nodes, model.config.dtype)
    t_ar = costmodel.t_ar(model.config, hw, b, context, model.config.dtype)
    return {"predicted_speedup": tree.expected_tokens(vec) * t_ar / t_round,
            "predicted_speedup_at_measured_acceptance": measured_tokens_per_round * t_ar / t_round,
            "predicted_round_over_ar_step": t_round / t_ar}

  for b, ctx in args.shapes:
    if (time.time() - t_start) / 60 > args.budget_min:
      break
    prompts, text = common.text_prompts(model, b, ctx, model.config.vocab_size)
    rec = {"batch": b, "context": ctx, "text": text, "runs": {}}
    doc["shapes"].append(rec)
    # what auto picks (the same call generate(gamma="auto"/tree="auto") makes); a pick that is also in the
    # sweep is the same configuration and executable: its sweep run is its measurement, not run twice
    context = max(len(p) for p in prompts) + args.max_new // 2
    picks = auto_picks(model.config, draft, len(prompts), context, args.profile, vec, args.max_new, rec)
    configs = [(f"gamma{g}", trees.Tree.chain(g)) for g in args.gammas]
    configs += [(n, trees.default_tree(n)) for n in args.trees.split(",") if n]
    for name, (tree, _) in picks.items():
      if not any(t == tree for _, t in configs):
        configs.insert(0, (name, tree))
    pre = prefilled.prefill(model, prompts, max_new_tokens=args.max_new,
                            max_tree_nodes=max(t.num_nodes for _, t in configs), progress=not args.smoke)
    rec["prefill_s"] = pre.prefill_s
    r = one(pre)
    if r is None:
      break
    ar, rec["runs"]["autoregressive"] = r
    for name, tree in configs:
      r = one(pre, draft=draft, tree=tree)
      if r is None:
        break
      res, m = r
      m["identical_to_ar"] = res.tokens == ar.tokens
      m["speedup"] = m["tokens_per_s"] / rec["runs"]["autoregressive"]["tokens_per_s"]
      m.update(predictions(tree, b, context, m["mean_accepted_length"]))
      rec["runs"][name] = m
      common.log(f"[auto_vs_sweep] b{b} x {ctx} {name}: {m['tokens_per_s']:.1f} tok/s "
                 f"(AR {rec['runs']['autoregressive']['tokens_per_s']:.1f}; {m['speedup']:.2f}x, predicted "
                 f"{m['predicted_speedup']:.2f}x / {m['predicted_speedup_at_measured_acceptance']:.2f}x at the "
                 f"measured acceptance)")
      for pick, (t, _) in picks.items():
        if t == tree:
          rec["auto_picks"][pick]["measured_by"] = name
      _summarize(rec, args)
      save()
    del pre
  save()
  common.finish(doc, out_path, os.path.basename(out_path))


def auto_picks(cfg, draft, batch: int, context: int, profile, vec, new_tokens: int, rec: dict) -> dict:
  """What generate(gamma="auto") / generate(tree="auto") resolve to (before the fallback): name -> (tree, info),
  recorded in rec["auto_picks"]. As in generate, a chain is priced with the fixed batch's tail over
  new_tokens (trees without it)."""
  picks = {}
  for name, want_tree in (("auto_gamma", False), ("auto_tree", True)):
    tree, info = autotune.choose(cfg, draft, batch, context, want_tree=want_tree, hardware=profile,
                                 acceptance_vector=vec, new_tokens=new_tokens)
    picks[name] = (tree, {k: v for k, v in info.items() if isinstance(v, (int, float, str))})
  rec["auto_picks"] = {k: dict(info, nodes=t.num_nodes, depth=t.max_depth, chain=t.is_chain)
                       for k, (t, info) in picks.items()}
  return picks


def rescore(path: str, output: str | None, smoke: bool = False) -> dict:
  """Measure nothing: resolve auto again with the current autotune rules (same profile, same acceptance
  vector) for every recorded shape and score its picks with the runs recorded there (a configuration's
  measurement does not depend on who picked it; a pick that was not measured is left unscored)."""
  doc = common.read_json(path)
  model = common.model(smoke)[0]
  draft = StreamingDraft(sink=doc["draft"]["sink"], window=doc["draft"]["window"])
  args = argparse.Namespace(**doc["args"])
  for rec in doc["shapes"]:
    measured = {n: (trees.Tree.chain(int(n[5:])) if n.startswith("gamma") else trees.default_tree(n))
                for n in rec["runs"] if n.startswith("gamma") or n in args.trees.split(",")}
    context = rec["context"] + doc["max_new_tokens"] // 2
    picks = auto_picks(model.config, draft, rec["batch"], context, args.profile, doc["acceptance_vector"],
                       doc["max_new_tokens"], rec)
    for k, (t, _) in picks.items():
      name = next((n for n, mt in measured.items() if mt == t), None)
      if name is not None:
        rec["auto_picks"][k]["measured_by"] = name
    _summarize(rec, args)
  doc["rescored"] = {"date": common.env_info()["date"], "from": os.path.basename(path),
                     "autotune": {"AUTO_MARGIN": autotune.AUTO_MARGIN, "AUTO_TIE": autotune.AUTO_TIE},
                     "note": "picks resolved again with these rules; runs (measurements) unchanged"}
  common.write_json(doc, output or path, stamp=False)
  print(json.dumps({f"{r['batch']}x{r['context']}": {k: v for k, v in r["summary"].items() if "over" in k}
                    for r in doc["shapes"]}, indent=1))
  return doc


def _summarize(rec: dict, args) -> None:
  runs, picks = rec["runs"], rec["auto_picks"]
  ar = runs["autoregressive"]["tokens_per_s"]
  chains = {k: v["tokens_per_s"] for k, v in runs.items() if k.startswith("gamma")}
  shipped = {k: v["tokens_per_s"] for k, v in runs.items() if k in args.trees.split(",")}
  summ = {"ar_tokens_per_s": ar}
  auto = {k: runs[p["measured_by"]]["tokens_per_s"] for k, p in picks.items() if p.get("measured_by") in runs}
  if chains:
    best = max(chains, key=chains.get)
    summ.update(best_gamma=int(best[5:]), best_gamma_tokens_per_s=chains[best], auto_gamma=picks["auto_gamma"]["gamma"])
    if "auto_gamma" in auto:
      summ.update(auto_gamma_tokens_per_s=auto["auto_gamma"], auto_gamma_over_best=auto["auto_gamma"] / chains[best])
  if shipped:
    best = max(shipped, key=shipped.get)
    summ.update(best_shipped_tree=best, best_shipped_tree_tokens_per_s=shipped[best],
                auto_tree_nodes=picks["auto_tree"]["nodes"], auto_tree_depth=picks["auto_tree"]["depth"])
    if "auto_tree" in auto:
      summ.update(auto_tree_tokens_per_s=auto["auto_tree"], auto_tree_over_best_shipped=auto["auto_tree"] / shipped[best])
  if chains or shipped:
    allbest = max(list(chains.values()) + list(shipped.values()))
    summ["best_of_sweep_tokens_per_s"] = allbest
    for k, v in auto.items():
      summ[f"{k}_over_best_of_sweep"] = v / allbest
    # generate's default auto_fallback: where the pick's predicted speedup is below 1 (or the tree has depth 0)
    # generate decodes autoregressively, so that configuration's measurement is the autoregressive run
    best_all = max(allbest, ar)
    summ["best_incl_autoregressive_tokens_per_s"] = best_all
    for k, p in picks.items():
      fallback = p["speedup"] < 1 + autotune.AUTO_MARGIN or p["depth"] == 0
      v = ar if fallback else auto.get(k)
      if v is not None:
        summ[f"{k}_with_fallback"] = "autoregressive" if fallback else p.get("measured_by")
        summ[f"{k}_with_fallback_over_best_incl_ar"] = v / best_all
  rec["summary"] = summ


if __name__ == "__main__":
  main()
