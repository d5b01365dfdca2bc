"""`run.py` with no flags (--mode=demo): the main job. MagicDec against plain decoding where MagicDec is meant to win.

The prompts are prefilled **once** (progress bar), then decoded autoregressively and with MagicDec
self-speculation (StreamingDraft: the target over sink + window tokens) from copies of the same caches, so
the comparison is of decoding alone, on identical K/V. Printed: tokens/s of both, the speedup, acceptance,
whether the greedy outputs are identical, and where the crossover lies on this kind of machine.

Why the shape matters: a decode step reads the weights once and the KV cache of every row. A self-draft
step reads the weights and only sink + window tokens of KV; a verify pass reads the weights and the whole
cache once for gamma + 1 tokens. When the weights dominate (short prompts, small batch) the draft costs
nearly a full step and speculation loses; when the KV cache dominates (long prompts x batch) drafting is
cheap relative to a step and the verify pass costs about one step, so MagicDec wins, and more so as the
context grows. SmolLM2-135M in float32 has 540 MB of weights and 46 KB of KV per token, so its KV cache
outweighs the weights only beyond ~12K tokens in the batch. The CPU default, 8 prompts of 4096 tokens
(1.5 GB of KV cache), is where it wins on a 2-core CPU within a few minutes (docs/measurements.md);
4 x 7900 holds the same KV but its prefill costs half as much again.

The prompts are several requests about one long document (the long-document extraction use): they share
the document's first `shared_tokens` tokens, prefilled once for all rows (prefilled.prefill copies that
K/V to every row), and each ends with a different passage. Decoding still reads every row's own full
cache, so what AR and MagicDec pay per step is what distinct prompts of that length would cost; only the
prefill gets cheaper. `shared_tokens=0` gives distinct prompts.

A second part (`structured_answers`) has the instruct model answer a few questions about the start of the
same document as JSON under a schema (structured output: every position masked by the schema's automaton,
the draft's proposals too), plainly and with the draft: the answers, whether each is valid, whether both
runs agree (greedy: they must), and the speedup.

Timing on a shared machine drifts (memory bandwidth seen from a VM moves by several x within minutes), so
AR and MagicDec are run alternately `repeats` times and the speedup is the ratio of their summed times.
"""
from __future__ import annotations

import glob
import json
import os

try:
  import jsonschema
except ImportError:     # optional: validity is then json.loads plus a check of the required keys and types
  jsonschema = None

import jax
from absl import app

from magicdec_jax import backend, drafts, generation, prefilled, textdata
from magicdec_jax import tokenizer as tok_lib
from magicdec_jax.cli import build as cli_build, flags as cli_flags
from magicdec_jax.measure import sweep
from magicdec_jax.tuning import profiles
from magicdec_jax.model import Model

OWN_FLAGS = ("batch_size", "prompt_tokens", "shared_tokens", "demo_repeats", "demo_structured")
SETTINGS_FLAGS = ("gamma", "max_new_tokens", "numerics", "seed", "temperature")

CPU_SHAPE = (8, 4096)      # batch x prompt tokens: KV 1.5 GB vs 0.54 GB of weights
CPU_GAMMA = 2              # on a CPU a verify pass pays for its extra tokens in compute: short chains
DISTINCT_TAIL = 256        # each demo prompt's own passage after the shared document (tokens)
GPU_SHAPE = (32, 7900)     # the paper's regime for a model of 8K context (not measured on a GPU here)
GPU_GAMMA = 3
DEMO_NEW_TOKENS = 256      # a fixed batch waits for its slowest row; that tail is ~1.09x the mean row's
                           # rounds over 64 tokens, ~1.05x over 128, ~1.04x over 256 (8 x 4096, this CPU:
                           # docs/measurements.md#notes-demo-tail)
SWEEP_GLOB = "benchmarks/results/context_sweep_*.json"
ANSWER_SCHEMA = {"type": "object", "properties": {"character": {"type": "string", "maxLength": 24},
                                                  "answer": {"type": "string", "maxLength": 60},
                                                  "sure": {"type": "boolean"}},
                 "required": ["character", "answer", "sure"]}
QUESTIONS = ("Who speaks first in this scene?", "Where does the scene take place?",
             "What is the mood of the opening lines?", "Name one character who is mentioned.")
ANSWER_DOCUMENT = 1024     # tokens of the document the structured answers read
ANSWER_NEW_TOKENS = 64
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout: run.py's


def default_shape() -> tuple[int, int, int]:
  """(batch, prompt tokens, gamma) where MagicDec should win on this backend."""
  return (*CPU_SHAPE, CPU_GAMMA) if backend.name() == "cpu" else (*GPU_SHAPE, GPU_GAMMA)


def _sweeps(root: str, device: str, cpu_model: str | None) -> list[tuple[str, dict]]:
  """(path, doc) of the context sweeps recorded on this device kind, oldest first (by recorded date): those
  recorded on `cpu_model` if there are any (CPU timings belong to a CPU model; jax calls every CPU "cpu"),
  else all of them."""
  docs = []
  for path in glob.glob(os.path.join(root, SWEEP_GLOB)):
    with open(path) as f:
      doc = json.load(f)
    env = doc.get("env", {})
    if env.get("device") == device:
      same = cpu_model is not None and env.get("cpu_model") == cpu_model
      docs.append((same, env.get("date", ""), path, doc))
  same = any(d[0] for d in docs)
  return [(path, doc) for _, _, path, doc in sorted(d for d in docs if d[0] == same)]


def _where(cpu_model: str | None, docs) -> str:
  """', on this CPU (...)' or ', on another CPU (...)': which CPU the sweeps `docs` ran on."""
  if cpu_model is None:
    return ""
  ran_on = sorted({d["env"].get("cpu_model") or "" for d in docs})
  if ran_on == [cpu_model]:
    return f", on this CPU ({cpu_model})"
  return (", on " + " / ".join(f"another CPU ({c})" if c else "an unrecorded CPU" for c in ran_on)
          + ", not necessarily like this one")


def _cite(path: str, doc: dict) -> str:
  return f"{os.path.basename(path)}, {doc['env']['date'][:10]}"


def _crossover_text(points: list[dict]) -> str:
  """One batch's crossover over its measured points: '4096'; '<= 1024' when speculation won already at
  the smallest context measured (the crossover lies there or below); 'not reached up to 8000'."""
  contexts = [p["context"] for p in points]
  measured = sweep.measured_crossover(points)
  if measured is None:
    return f"not reached up to {max(contexts)}"
  return f"<= {measured}" if measured == min(contexts) else str(measured)


def _newest_points(root: str, device: str, cpu_model: str | None) -> dict[tuple[int, int], tuple]:
  """(batch, context) -> (point, path, doc): the sweeps of this device kind (`_sweeps`: this CPU model's if
  any) merged point by point, the newest measurement (by recorded date) of each batch x context winning."""
  newest = {}
  for path, doc in _sweeps(root, device, cpu_model):  # oldest first: newer ones overwrite
    for p in doc.get("points", []):
      if p.get("best_decode_speedup") is not None:
        newest[(p["batch"], p["context"])] = (p, path, doc)
  return newest


def measured_crossover(root: str, device: str, cpu_model: str | None = None) -> str | None:
  """One line naming where speculation first beat autoregressive decoding per batch, from the context
  sweeps' merged points (`_newest_points`): the crossover is taken over the merged contexts of each batch,
  so a later sweep of one batch or one context adds to the earlier ones instead of hiding them. The line
  names the files and the CPU they ran on, and says when that is not this one. None if no sweep was
  recorded on this device kind."""
  newest = _newest_points(root, device, cpu_model)
  if not newest:
    return None
  by_batch: dict[int, list[dict]] = {}
  for (b, _), (p, _, _) in sorted(newest.items()):
    by_batch.setdefault(b, []).append(p)
  parts = [f"batch {b}: {_crossover_text(pts)}" for b, pts in sorted(by_batch.items())]
  used = {path: doc for _, path, doc in newest.values()}
  files = ", ".join(_cite(p, d) for p, d in sorted(used.items()))
  return (f"measured crossover (decode speedup > 1 from this context on; {files}"
          f"{_where(cpu_model, used.values())}): " + ", ".join(parts))


def measured_point(root: str, device: str, batch: int, context: int, cpu_model: str | None = None) -> str | None:
  """One line giving the newest sweep's measured decode speedup at this batch x context (its prompts are
  distinct passages, not one shared document), or None if no sweep of this device kind measured it."""
  found = _newest_points(root, device, cpu_model).get((batch, context))
  if found is None:
    return None
  p, path, doc = found
  best = next((s for s in p.get("spec", []) if s.get("gamma") == p.get("best_gamma")), {})
  acc = best.get("acceptance_rate")
  return (f"the context sweep at {batch} x {context} (distinct prompts, {doc.get('max_new_tokens')} new tokens"
          f"{', acceptance %.2f' % acc if acc is not None else ''}; {_cite(path, doc)}"
          f"{_where(cpu_model, [doc])}): decode speedup {p['best_decode_speedup']:.2f}x")


def default_shared_tokens(prompt_tokens: int, chunk: int = 256) -> int:
  """The document shared by the demo's prompts: all but the last DISTINCT_TAIL tokens, whole chunks."""
  return max(prompt_tokens - DISTINCT_TAIL, 0) // chunk * chunk


def validate(fv) -> None:
  cli_flags.validate_draft(fv)
  cli_flags.validate_acceptance_file(fv)
  if fv.shared_tokens is not None and fv["prompt_tokens"].present and fv.shared_tokens >= fv.prompt_tokens:
    raise app.UsageError(f"--shared_tokens={fv.shared_tokens} must be below --prompt_tokens={fv.prompt_tokens}")
  cli_flags.refuse_no_draft(fv, "compares against a draft")
  if drafts.REGISTRY.get(fv.draft) is not drafts.StreamingDraft:     # (run builds it: another would be ignored)
    raise app.UsageError(f"--mode=demo compares the StreamingLLM self-draft (--draft={drafts.StreamingDraft.name}), "
                         f"got --draft={fv.draft}; --mode=generate or bench run the others")


def run(fv, log) -> None:
  """`run.py` (--mode=demo): `compare` on --model; batch, prompt length, new tokens, gamma and the draft's
  weights are `default_shape()`, DEMO_NEW_TOKENS and bfloat16 unless given. Then `structured_answers` with
  the same draft, gamma and numerics (its draft's weights the target's own unless --draft_weights is given)."""
  model = cli_build.load_target(fv, log)
  batch, prompt_tokens, gamma = default_shape()
  given = lambda name: fv[name].present
  gamma = cli_flags.parse_gamma(fv.gamma) if given("gamma") else gamma
  weights = (None if fv.draft_weights == "none" else fv.draft_weights) if given("draft_weights") else "bfloat16"
  compare(model, batch=fv.batch_size if given("batch_size") else batch,
          prompt_tokens=fv.prompt_tokens if given("prompt_tokens") else prompt_tokens,
          max_new_tokens=fv.max_new_tokens if given("max_new_tokens") else DEMO_NEW_TOKENS,
          gamma=gamma, sink=fv.sink, window=fv.window,
          temperature=fv.temperature, seed=fv.seed, progress=fv.progress, shared_tokens=fv.shared_tokens,
          repeats=fv.demo_repeats, shrink_batch=fv.shrink_batch, numerics=fv.numerics,
          draft_weights=weights, log=log, root=ROOT)
  if fv.demo_structured:
    # the draft's weights only when asked for: at the structured part's short document a bfloat16 copy
    # decodes no faster than the full-precision draft (docs/measurements.md#demo-runs)
    structured_answers(model, gamma=gamma, sink=fv.sink, window=fv.window,
                       draft_weights=weights if given("draft_weights") else None, numerics=fv.numerics, log=log)


def valid_answer(text: str) -> bool:
  """Whether `text` is a JSON object valid under ANSWER_SCHEMA (jsonschema if installed, else json.loads and
  the required keys' types)."""
  try:
    obj = json.loads(text)
  except ValueError:
    return False
  if jsonschema is not None:
    return jsonschema.Draft202012Validator(ANSWER_SCHEMA).is_valid(obj)
  kinds = {"string": str, "boolean": bool}
  return isinstance(obj, dict) and all(
      isinstance(obj.get(k), kinds[ANSWER_SCHEMA["properties"][k]["type"]]) for k in ANSWER_SCHEMA["required"])


def structured_answers(model: Model, *, gamma: int, sink: int, window: int, questions=QUESTIONS,
                       document_tokens: int = ANSWER_DOCUMENT, max_new_tokens: int = ANSWER_NEW_TOKENS,
                       draft_weights: str | None = None, numerics: str | None = None, log=print) -> dict:
  """The instruct model answers `questions` about the document's first `document_tokens` tokens as JSON
  under ANSWER_SCHEMA (its chat template), greedily, plainly and with the StreamingDraft (its weights:
  `draft_weights`, as in `compare`); prints the answers, their validity, whether both runs agree and the
  decode speedup. Returns the figures."""
  doc = model.tokenizer.decode(textdata.shakespeare_prompt(model.tokenizer, document_tokens),
                               skip_special_tokens=True)
  prompts = [tok_lib.chat_prompt(model, [{"role": "user", "content":
             f"{doc}\n\nAbout the text above: {q} Answer as JSON with the keys character, answer and sure."}])
             for q in questions]
  log(f"structured output: {len(prompts)} questions about a {document_tokens}-token document, answers as JSON "
      f"under a schema, plainly and with MagicDec ({_draft(sink, window, draft_weights, gamma)})")
  kw = dict(max_new_tokens=max_new_tokens, json_schema=ANSWER_SCHEMA, numerics=numerics)
  plain = generation.generate(model, prompts, **kw)
  spec = generation.generate(model, prompts, draft=drafts.StreamingDraft(sink, window, weights=draft_weights),
                             gamma=gamma, **kw)
  texts = [t.replace(model.tokenizer.decode(model.config.eos_token_ids[:1]), "") for t in plain.texts]
  ok = [valid_answer(t) for t in texts]
  agree = plain.tokens == spec.tokens
  speedup = spec.stats["tokens_per_s"] / plain.stats["tokens_per_s"]
  print(f"\nStructured answers (JSON schema: {', '.join(ANSWER_SCHEMA['required'])}), "
        f"{len(prompts)} x {document_tokens}-token document; "
        f"MagicDec with {_draft(sink, window, draft_weights, gamma)}:")
  for q, t, v, r in zip(questions, texts, ok, plain.finish_reasons):
    print(f"  {q}\n    {t}   [{'valid' if v else 'NOT valid'}, {r}]")
  print(f"  valid: {sum(ok)}/{len(ok)}   plain and MagicDec agree token for token: {agree}")
  print(f"  plain {plain.stats['tokens_per_s']:.1f} tokens/s, MagicDec {spec.stats['tokens_per_s']:.1f} tokens/s: "
        f"speedup {speedup:.2f}x (acceptance {spec.stats['acceptance_rate'] or 0:.2f}; a short document, where "
        f"drafting gains little on a CPU)")
  return {"valid": ok, "agree": agree, "speedup": speedup, "texts": texts}


def compare(model: Model, *, batch: int, prompt_tokens: int, max_new_tokens: int, gamma: int, sink: int,
            window: int, temperature: float, seed: int, progress: bool, shared_tokens: int | None = None,
            repeats: int = 2, draft_weights: str | None = None, shrink_batch: bool = False,
            numerics: str | None = None, log=print, root: str = ".") -> dict:
  """Prefill once, decode both ways (alternately, `repeats` times each), print the comparison; returns
  the figures. shared_tokens: the document all prompts start with (None: default_shared_tokens);
  draft_weights: StreamingDraft.weights (None: the target's own; "bfloat16": a narrower copy);
  shrink_batch: both decodes shrink the batch as rows finish (shrink.py); numerics: DecodeSettings.numerics."""
  shared_tokens = default_shared_tokens(prompt_tokens) if shared_tokens is None else shared_tokens
  if not 0 <= shared_tokens < prompt_tokens:
    raise ValueError(f"shared_tokens must be in [0, prompt_tokens={prompt_tokens}), got {shared_tokens}")
  if repeats < 1:
    raise ValueError(f"repeats must be >= 1, got {repeats}")
  draft = drafts.StreamingDraft(sink, window, weights=draft_weights)
  prompts = textdata.document_prompts(model.tokenizer, batch, prompt_tokens, shared_tokens)
  log(f"{batch} Shakespeare prompts of {prompt_tokens} tokens"
      + (f" (one shared {shared_tokens}-token document, then a different passage each)" if shared_tokens else "")
      + f"; prefill once, then decode {max_new_tokens} tokens autoregressively and with MagicDec "
      f"({_draft(sink, window, draft_weights, gamma)}), alternately, {repeats} time(s) each")
  pre = prefilled.prefill(model, prompts, max_new_tokens=max_new_tokens, progress=progress, numerics=numerics)
  log(f"prefill: {pre.prefill_s:.1f}s ({batch * prompt_tokens / pre.prefill_s:.0f} prompt tokens/s; "
      f"{pre.shared_tokens} shared tokens computed once) + {pre.compile_s:.1f}s compile")
  gen = dict(temperature=temperature, seed=seed, shrink_batch=shrink_batch, numerics=numerics)
  ars, mds = [], []
  for r in range(repeats):
    ars.append(prefilled.decode(model, pre, **gen))
    log(f"autoregressive ({r + 1}/{repeats}): decode {ars[-1].stats['decode_s']:.1f}s + "
        f"{ars[-1].stats['decode_compile_s']:.1f}s compile")
    mds.append(prefilled.decode(model, pre, draft=draft, gamma=gamma, **gen))
    log(f"MagicDec ({r + 1}/{repeats}): decode {mds[-1].stats['decode_s']:.1f}s + "
        f"{mds[-1].stats['decode_compile_s']:.1f}s compile (draft cache built in {mds[-1].stats['ring_s']:.2f}s)")
  md = mds[-1]
  a, m = _summed(ars), _summed(mds)
  speedup = m["tokens_per_s"] / a["tokens_per_s"]
  pairs = [y.stats["tokens_per_s"] / x.stats["tokens_per_s"] for x, y in zip(ars, mds)]
  same = all(x.tokens == y.tokens for x, y in zip(ars, mds))
  device = f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind}"
  weights_gb = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params)) / 1e9
  cfg = model.config
  kv_gb = (2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jax.numpy.dtype(cfg.dtype).itemsize
           * batch * (prompt_tokens + max_new_tokens) / 1e9)
  print(f"\nMagicDec demo: {model.name} on {device}, batch {batch} x {prompt_tokens}-token prompts, "
        f"{max_new_tokens} new tokens, temperature {temperature}")
  print(f"  autoregressive : {a['tokens_per_s']:8.1f} tokens/s  ({a['decode_s']:.2f}s, "
        f"{a['decode_s'] / max(a['loop_rounds'], 1) * 1e3:.0f} ms per step)")
  print(f"  MagicDec       : {m['tokens_per_s']:8.1f} tokens/s  ({m['decode_s']:.2f}s, "
        f"{m['decode_s'] / max(m['loop_rounds'], 1) * 1e3:.0f} ms per round of gamma {gamma})")
  print(f"  speedup        : {speedup:.2f}x   acceptance rate {m['acceptance_rate']:.3f}   mean accepted "
        f"length {m['mean_accepted_length']:.2f}")
  if repeats > 1:
    print(f"                   (summed over {repeats} alternated runs each; run by run: "
          + ", ".join(f"{x:.2f}x" for x in pairs) + ")")
  tail = m["loop_rounds"] / max(m["verify_steps"] / batch, 1)     # batch rounds / the mean row's rounds
  if shrink_batch:
    print("  shrinking batch: " + ", then ".join(f"{r} rounds at batch {b}" for b, r, _ in md.stats["batch_stages"])
          + " (last MagicDec run)")
  else:
    print(f"  tail           : the mean row needed {m['verify_steps'] / batch / repeats:.1f} rounds, the batch ran "
          f"{m['loop_rounds'] / repeats:.1f} (its slowest row; finished rows wait), {tail:.2f}x the mean: "
          f"without that tail ~{speedup * tail:.2f}x (a projection; --mode=datagen refills finished rows; "
          f"--shrink_batch shrinks the batch instead, which did not pay on a 2-core CPU: docs/shrink-batch.md)")
  if temperature == 0:
    print(f"  identical greedy tokens: {same}")
  print(f"  prefill (once, shared): {pre.prefill_s:.1f}s"
        + (f" ({pre.shared_tokens} document tokens computed once for all rows)" if pre.shared_tokens else "")
        + "; seconds exclude compilation")
  draft_w = f"a {draft_weights} copy of the weights ({weights_gb / 2:.2f} GB)" if draft_weights else "the weights"
  print(f"  MagicDec's draft: the target over sink {sink} + window {window} tokens{_weights(draft_weights)}")
  print(f"  why: each step reads {weights_gb:.2f} GB of weights and {kv_gb:.2f} GB of KV cache; the draft reads "
        f"{draft_w} and only {sink + window} tokens of KV per row, the verify pass the whole cache once for "
        f"{gamma + 1} tokens.")
  cpu_model = profiles.host_cpu_model() if device.startswith("cpu") else None
  line = measured_crossover(root, device, cpu_model)
  print("  " + (line or "crossover: no context sweep recorded on this kind of device "
                "(python -m benchmarks.decode.context_sweep measures it)"))
  copied = sum(textdata.copied_share(p, t) for p, t in zip(prompts, md.tokens)) / batch
  point = measured_point(root, device, batch, prompt_tokens, cpu_model)
  print(f"  predictability : {copied:.0%} of the new tokens repeat a 4-token sequence already in their prompt or "
        f"output, which lifts acceptance (greedy decoding of a small model loops)"
        + (f"; for less repetitive text, {point}" if point else ""))
  text = md.texts[0] if md.texts else md.tokens[0]
  print(f"\n--- prompt 0 ends with ---\n...{model.tokenizer.decode(prompts[0][-40:])}")
  print(f"--- MagicDec continuation ---\n{text}\n")
  return {"speedup": speedup, "speedup_by_run": pairs, "tail": tail, "identical": same, "copied_share": copied,
          "ar": a, "magicdec": m, "prefill_s": pre.prefill_s, "shared_tokens": pre.shared_tokens}


def _weights(dtype: str | None) -> str:
  return f", {dtype} weights" if dtype else ""


def _draft(sink: int, window: int, dtype: str | None, gamma: int) -> str:
  """How the demo names its draft and gamma in what it prints and logs."""
  return f"StreamingDraft sink {sink} + window {window}{_weights(dtype)}, gamma {gamma}"


def _summed(results) -> dict:
  """The stats of several decodes of the same batch as one: summed seconds, tokens and rounds."""
  s = dict(results[-1].stats)
  for k in ("decode_s", "new_tokens", "verify_steps", "loop_rounds"):
    s[k] = sum(r.stats[k] for r in results)
  s["tokens_per_s"] = s["new_tokens"] / s["decode_s"] if s["decode_s"] > 0 else None
  return s
