"""The package's docstrings and comments state contracts: no dates, issue numbers, result-file names or files
outside the repository in them (those belong in docs/decisions.md and docs/measurements.md, which the code
cites by anchor), and the backend is asked in few places. Read from the source text only: milliseconds."""
from __future__ import annotations

import ast
import io
import os
import re
import tokenize

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCES = ("magicdec_jax", "checkpoints_convert", "run.py")

# what a contract does not hold: a date, an issue / PR number, a results file or directory, a numbered run
# of a findings log, a file outside the repository
FORBIDDEN = re.compile(
    r"\b20\d\d-\d\d-\d\d\b"                                     # a date
    r"|\b(?:issue|PR|pull request)s?\s+#?\d+"                    # an issue or PR number
    r"|\bresults/"                                              # the benchmarks' results directory
    r"|[\w*{},.-]+_(?:cpu|gpu|h100|h200|tpu)[\w*{},.-]*\.json"  # a result file's name
    r"|\brun \d+\b"                                             # a numbered run of a findings log
    r"|GPU-FINDINGS|\.\./shared|\bshared/", re.IGNORECASE)
# modules that may call jax.default_backend() (backend.name() is the package's way to ask)
DEFAULT_BACKEND_ALLOWED = {"magicdec_jax/backend.py"}


def _files(sources=SOURCES):
  for entry in sources:
    path = os.path.join(REPO, entry)
    if os.path.isfile(path):
      yield entry
      continue
    for dirpath, _, files in os.walk(path):
      for f in sorted(files):
        if f.endswith(".py"):
          yield os.path.relpath(os.path.join(dirpath, f), REPO)


def prose(source: str) -> list[tuple[int, str]]:
  """(line, text) of every comment and docstring of a module's source."""
  out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
         if tok.type == tokenize.COMMENT]
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
      first = node.body[0]
      if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        out.append((first.lineno, first.value.value))
  return out


def violations(source: str) -> list[tuple[int, str]]:
  """(line, the forbidden text) in the comments and docstrings of `source`."""
  return [(line, m.group(0)) for line, text in prose(source) for m in FORBIDDEN.finditer(text)]


def test_docstrings_and_comments_hold_no_dates_issues_or_result_files():
  bad = []
  for rel in _files():
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
      bad += [f"{rel}:{line}: {hit!r}" for line, hit in violations(f.read())]
  assert not bad, "move these to docs/decisions.md or docs/measurements.md and cite the anchor:\n  " + \
      "\n  ".join(bad)


OUTSIDE = re.compile(r"\b(?:issue|PR|pull request)s?\s+#?\d+|GPU-FINDINGS|\.\./shared\b", re.IGNORECASE)


def test_no_text_in_the_repository_cites_issues_or_files_outside_it():
  """README, docs, benchmarks and tests too: a reader of the repository has neither the issue tracker nor
  files beside the checkout (this file names the patterns it forbids, so it is left out)."""
  bad = []
  for top in ("README.md", "docs", "benchmarks", "tests", "scripts"):
    path = os.path.join(REPO, top)
    walk = [(REPO, [], [top])] if os.path.isfile(path) else os.walk(path)
    for dirpath, _, files in walk:
      for f in files:
        rel = os.path.relpath(os.path.join(dirpath, f), REPO)
        if not f.endswith((".md", ".py", ".sh")) or rel == "tests/project/test_house.py":
          continue
        with open(os.path.join(REPO, rel), encoding="utf-8") as fh:
          bad += [f"{rel}:{n}: {m.group(0)!r}" for n, line in enumerate(fh, 1) for m in OUTSIDE.finditer(line)]
  assert not bad, "\n  ".join(["texts citing an issue or a file outside the repository:"] + bad)


def test_the_scan_sees_what_it_forbids():
  src = ('"""Measured 2026-11-27 (issue 46; benchmarks/results/x_cpu_2026-11-27.json, docs/gpu.md run 5)."""\n'
         "X = 1  # see ../shared/GPU-FINDINGS.md\n"
         "def f():\n  '''Cites docs/decisions.md#quantized-weights, runs 2 x 4 rows.'''\n")
  hits = [h for _, h in violations(src)]
  assert {"2026-11-27", "issue 46", "results/", "run 5", "GPU-FINDINGS", "../shared"} <= set(hits), hits
  assert not any("decisions" in h or h.startswith("runs 2") for h in hits), hits
  assert violations('URL = "benchmarks/results/x_cpu_2026-11-27.json"\n') == []     # code, not prose


def test_jax_default_backend_is_read_in_few_modules():
  """The backend is asked through backend.name() (or a value resolved from it once: FixedShapes, QuantForm)."""
  readers = set()
  for rel in _files():
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
      tree = ast.parse(f.read())
    if any(isinstance(n, ast.Attribute) and n.attr == "default_backend" for n in ast.walk(tree)):
      readers.add(rel.replace(os.sep, "/"))
  assert readers <= DEFAULT_BACKEND_ALLOWED, sorted(readers - DEFAULT_BACKEND_ALLOWED)


def test_every_weight_is_declared_once():
  """config.WEIGHTS declares every parameter of the model: the Flax modules create exactly the shapes it
  gives (expected_shapes), every leaf finds its declaration, and a quantized copy's contracted axes and the
  partition rules are read from it."""
  import jax

  from magicdec_jax.config import WEIGHTS, ModelConfig, expected_shapes, is_shape, weight_at
  from magicdec_jax.layers import quant
  from magicdec_jax.model import init_params
  from magicdec_jax.sharding import rules

  for tied, extras in ((True, {}), (False, dict(qkv_bias=True, o_bias=True, qk_norm=True, post_norms=True))):
    cfg = ModelConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64, tie_embeddings=tied, **extras)
    params = init_params(cfg, jax.random.key(0))
    assert jax.tree.map(lambda a: tuple(a.shape), params) == expected_shapes(cfg)
    for path, leaf in jax.tree_util.tree_flatten_with_path(expected_shapes(cfg), is_leaf=is_shape)[0]:
      keys = rules.path_keys(path)
      w = weight_at(keys)
      assert w is not None and w.shape(cfg) == leaf, (keys, w)
  assert {n: w.contracted for n, w in WEIGHTS.items() if w.contracted is not None}.items() <= quant.CONTRACTED.items()
  assert weight_at(["target_head", "embed"]) is None and weight_at(["fc", "q"]) is None   # placed, not by name alone


def private_uses(source: str, module: str = "") -> list[tuple[int, str]]:
  """(line, name) for each private name (one leading underscore) of a magicdec_jax module that `source`
  imports or reads through an imported name; `module` (dotted) may use its own."""
  aliases, out, tree = {}, [], ast.parse(source)
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.name.split(".")[0] == "magicdec_jax":     # `import a.b as c` binds c to a.b; `import a.b`, a
          aliases[a.asname or "magicdec_jax"] = a.name if a.asname else "magicdec_jax"
    elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "magicdec_jax":
      for a in node.names:
        if a.name.startswith("_") and not a.name.startswith("__") and node.module != module:
          out.append((node.lineno, f"{node.module}.{a.name}"))
        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
      root, chain = node.value, []
      while isinstance(root, ast.Attribute):
        chain.insert(0, root.attr)
        root = root.value
      if isinstance(root, ast.Name) and root.id in aliases:
        owner = ".".join([aliases[root.id], *chain])
        if owner != module:
          out.append((node.lineno, f"{owner}.{node.attr}"))
  return out


def test_no_module_reads_another_modules_private_names():
  """Tests, benchmarks and the package reach each module through its public names only."""
  found = []
  for rel in _files(SOURCES + ("benchmarks", "tests")):
    module = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
    with open(os.path.join(REPO, rel), encoding="utf-8") as fh:
      found += [(rel, line, name) for line, name in private_uses(fh.read(), module)]
  assert found == [], found


def test_the_private_name_scan_sees_what_it_forbids():
  src = ("import magicdec_jax as md\nfrom magicdec_jax import compile as compiling\n"
         "from magicdec_jax.loop import _round, decode\nfrom magicdec_jax.sharding import rules\n"
         "a = compiling._max\nb = md.loop._state\nc = rules._keys(1)\nd = decode.__wrapped__\ne = x._y\n")
  assert sorted(name for _, name in private_uses(src)) == [
      "magicdec_jax.compile._max", "magicdec_jax.loop._round", "magicdec_jax.loop._state",
      "magicdec_jax.sharding.rules._keys"]
  assert private_uses("from magicdec_jax.compile import _lock\n", "magicdec_jax.compile") == []
