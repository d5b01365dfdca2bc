"""What compiling a structured-output constraint costs on the host: time, states, token classes, memory.

For each schema (the tests' 4-field one, a 20-field one cycling string / integer / number / boolean / enum,
OpenAI's json_object) over SmolLM2-135M's 49,152 tokens: the median wall and CPU time of `--repeats` uncached
compiles (`automaton.compile_regex`) and of their outlines-core token index (`index.token_index`), the
states, classes and bytes; the batch table of all of them; a cache hit; the vocabulary build; and the jitted
`ops.allowed` mask of [8, 4, V] (a chain of 3 drafts + 1) and `ops.advance`.

  python -m benchmarks.constraints.compile
  python -m benchmarks.constraints.compile --smoke      # the byte tokenizer, small schemas: seconds
"""
from __future__ import annotations

import importlib.metadata
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from magicdec_jax import constraints, testing
from magicdec_jax.constraints import automaton, index, ops

FOUR_FIELDS = {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                              "tags": {"type": "array", "items": {"type": "string"}},
                              "color": {"enum": ["red", "green", "blue"]}},
               "required": ["name", "age", "tags", "color"]}
FIELD_KINDS = ({"type": "string", "maxLength": 16}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"},
               {"enum": ["low", "medium", "high"]})


def many_fields(n: int) -> dict:
  props = {f"field_{k}": FIELD_KINDS[k % len(FIELD_KINDS)] for k in range(n)}
  return {"type": "object", "properties": props, "required": list(props)}


def timed(fn, repeats: int) -> tuple[float, list[float], object, float]:
  """(median wall s, wall times, fn's result, median CPU s of this process): on a shared machine the CPU
  time is the steadier figure (waiting for a core is not counted)."""
  out, times, cpu = None, [], []
  for _ in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return float(np.median(times)), [round(t, 4) for t in times], out, float(np.median(cpu))


def main(argv=None):
  ap = common.parser(__doc__)
  ap.add_argument("--repeats", type=int, default=5)
  args = common.parse(ap, argv, repeats=2)
  env = common.env_info()
  if args.smoke:
    tok, eos, vocab_size, source = testing.byte_tokenizer(), (256,), 264, "byte tokenizer"
    schemas = {"four_fields": FOUR_FIELDS, "six_fields": many_fields(6)}
  else:
    model, source = common.model(False)
    tok, eos, vocab_size = model.tokenizer, model.config.eos_token_ids, model.config.vocab_size
    schemas = {"four_fields": FOUR_FIELDS, "twenty_fields": many_fields(20), "json_object": {"type": "object"}}
  vocab_s, _, vocab, _ = timed(lambda: constraints.build_vocabulary(tok, eos, vocab_size), 1)
  results, built = {}, []
  for name, schema in schemas.items():
    spec_s, _, c, _ = timed(lambda: constraints.Constraint.json_schema(schema), args.repeats)
    regex = c.to_regex()
    index_s, index_times, _, index_cpu = timed(lambda: index.token_index(regex, vocab), args.repeats)
    total_s, times, a, total_cpu = timed(
        lambda: automaton.compile_regex(regex, vocab, ("json_schema", c.spec, "bench")), args.repeats)
    built.append(a)
    results[name] = {"regex_chars": len(regex), "spec_s": round(spec_s, 5), "compile_s": round(total_s, 4),
                     "compile_times": times, "compile_cpu_s": round(total_cpu, 4),
                     "outlines_index_s": round(index_s, 4), "index_times": index_times,
                     "outlines_index_cpu_s": round(index_cpu, 4),
                     "states": a.num_states, "classes": a.num_classes, "automaton_bytes": a.nbytes,
                     "next_state_bytes": a.next_state.nbytes, "token_class_bytes": a.token_class.nbytes}
    print(f"{name}: compile {total_s:.3f} s, CPU {total_cpu:.3f} s (outlines-core index {index_s:.3f} s, CPU "
          f"{index_cpu:.3f} s), {a.num_states} states, "
          f"{a.num_classes} classes, {a.nbytes / 1e6:.2f} MB", flush=True)
  c = constraints.Constraint.json_schema(FOUR_FIELDS)
  constraints.compile_constraint(c, vocab)
  hit_s, _, _, _ = timed(lambda: constraints.compile_constraint(c, vocab), 100)
  table, auto = constraints.batch_table(built + [None] * 5, vocab_size)
  arrays = jax.tree.leaves(table)
  table = jax.tree.map(jnp.asarray, table)
  batch = len(built) + 5
  auto = jnp.asarray(auto)
  state = jnp.zeros((batch, 4), jnp.int32)
  allowed = jax.jit(ops.allowed)
  advance = jax.jit(ops.advance)
  tokens = jnp.zeros((batch, 4), jnp.int32)
  mask_s, _ = common.median_time(lambda: allowed(table, auto, state), max(args.repeats, 3) * 4)
  adv_s, _ = common.median_time(lambda: advance(table, auto, state, tokens), max(args.repeats, 3) * 4)
  doc = common.record(
      "constraint_compile", env=env, vocabulary=source, vocab_size=vocab_size,
      versions={p: importlib.metadata.version(p) for p in ("outlines_core", "numpy")},
      vocabulary_build_s=round(vocab_s, 4), repeats=args.repeats, schemas=results, cache_hit_us=round(hit_s * 1e6, 2),
      table={"automata": len(built), "rows": batch, "shape": list(table.shape), "bytes": sum(x.nbytes for x in arrays)},
      allowed_mask={"shape": [batch, 4, vocab_size], "ms": round(mask_s * 1e3, 4)},
      advance={"shape": [batch, 4], "ms": round(adv_s * 1e3, 4)})
  common.finish(doc, args.output, f"constraint_compile_{common.device_tag()}.json")
  return doc


if __name__ == "__main__":
  main()
