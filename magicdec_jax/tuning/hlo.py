"""Reading optimized HLO text: which big buffers a compiled while-loop body copies, slices or pads.

At long context decoding is bound by reading weights and KV caches once per step; any op in the loop
body that *produces* a buffer shaped like a weight matrix or a layer's cache is an extra pass over it
(a copy out of a stack, a pad to a tile, a transpose). `loop_body_copies` lists such ops so tests and
benchmarks can assert there are none. In-place writes (scatter, dynamic-update-slice, and fusions rooted
in one) also produce cache-shaped results but alias their input, so they are not counted.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re

_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\) -> .* \{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = ")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations|called_computations)="
                    r"\{?(%?[\w.\-]+(?:, ?%?[\w.\-]+)*)\}?")
_SHAPE = re.compile(r"^[a-z]+\d*\[([\d,]*)\]")
IN_PLACE = ("scatter", "dynamic-update-slice")
NEUTRAL = ("parameter", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
           "constant", "after-all", "opt-barrier", "optimization-barrier")


@dataclasses.dataclass(frozen=True)
class Instr:
  name: str
  shape: tuple[int, ...] | None   # None for tuple-typed results
  op: str
  line: str
  operands: tuple[str, ...] = ()

  @property
  def size(self) -> int | None:
    return None if self.shape is None else math.prod(self.shape)


def _parse_instr(line: str) -> Instr | None:
  m = _INSTR.match(line)
  if not m:
    return None
  rest = line[m.end():]
  if rest.startswith("("):                       # tuple type: skip to its closing paren
    depth = 0
    for i, ch in enumerate(rest):
      depth += ch == "("
      depth -= ch == ")"
      if depth == 0:
        break
    typ, rest = rest[:i + 1], rest[i + 1:].lstrip()
  else:
    typ, _, rest = rest.partition(" ")
  op, _, args = rest.partition("(")
  depth, end = 1, len(args)
  for i, ch in enumerate(args):
    depth += (ch == "(") - (ch == ")")
    if depth == 0:
      end = i
      break
  operands = tuple(a.strip().split(" ")[-1].lstrip("%") for a in args[:end].split(",") if "%" in a)
  sm = _SHAPE.match(typ)
  shape = tuple(int(d) for d in sm.group(1).split(",") if d) if sm else None
  return Instr(m.group(1), shape, op, line.strip(), operands)


@functools.lru_cache(maxsize=4)
def computations(text: str) -> dict[str, list[Instr]]:
  """{computation name: its instructions} of an HLO module's text; shared between callers (read only):
  the checks below each walk the same module, which is parsed once."""
  comps, cur = {}, None
  for line in text.splitlines():
    h = _HEADER.match(line.strip()) if not line.startswith(" ") else None
    if h:
      cur = comps.setdefault(h.group(1), [])
      continue
    if line.strip() == "}":
      cur = None
      continue
    if cur is not None:
      ins = _parse_instr(line)
      if ins:
        cur.append(ins)
  return comps


def _callees(ins: Instr) -> list[str]:
  out = []
  for m in _CALLS.finditer(ins.line):
    out += [c.strip().lstrip("%") for c in m.group(1).split(",")]
  return out


def while_carried(text: str) -> set[tuple[str, tuple[int, ...]]]:
  """(element type, shape) of every array a while loop of the module carries (its tuple-typed result),
  e.g. ("bf16", (192, 128)): what the loop holds across iterations, such as a matrix converted before it."""
  carried = set()
  for instrs in computations(text).values():
    for ins in instrs:
      if ins.op == "while":
        typ = ins.line.split(" while(")[0].partition("=")[2]
        carried |= {(t, tuple(int(d) for d in dims.split(",") if d))
                    for t, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", typ)}
  return carried


def while_body_computations(text: str) -> tuple[dict[str, list[Instr]], set[str]]:
  """(all computations, names of every non-fusion computation run inside a while body)."""
  comps = computations(text)
  bodies = set()
  for instrs in comps.values():
    for ins in instrs:
      if ins.op == "while":
        m = re.search(r"body=%?([\w.\-]+)", ins.line)
        if m:
          bodies.add(m.group(1))
  seen, todo = set(), list(bodies)
  while todo:
    c = todo.pop()
    if c in seen or c not in comps:
      continue
    seen.add(c)
    for ins in comps[c]:
      if ins.op != "fusion":
        todo += _callees(ins)
  return comps, seen


def _fusion_root_op(comps, ins: Instr) -> str:
  m = re.search(r"calls=%?([\w.\-]+)", ins.line)
  body = comps.get(m.group(1), []) if m else []
  roots = [i for i in body if i.line.startswith("ROOT ")]
  return roots[0].op if roots else ""


def loop_body_copies(text: str, shapes) -> list[Instr]:
  """Ops inside any while body that copy one of the big buffers whose dims are in `shapes`: an op whose
  result has such dims, or whose result has as many elements as a big buffer it reads (a transpose or
  a reshaping copy of a weight). In-place writes and neutral ops (tuples, bitcasts, ...) are not counted;
  neither are matmuls and reductions, whose results are activations of other sizes."""
  shapes = {tuple(s) for s in shapes}
  bad = []
  for comps, by_name, ins in _body_ops(text):
    if ins.shape is None:
      continue
    reads = [by_name[o] for o in ins.operands if o in by_name and by_name[o].shape in shapes]
    if ins.shape in shapes or any(r.size == ins.size for r in reads):
      bad.append(ins)
  return bad


def _body_ops(text: str):
  """(computations, the op's computation by name, op) for every op inside a while body that is neither
  neutral nor an in-place write (a scatter / dynamic-update-slice, or a fusion rooted in one)."""
  comps, body = while_body_computations(text)
  for c in body:
    by_name = {i.name: i for i in comps[c]}
    for ins in comps[c]:
      if ins.op in NEUTRAL or ins.op in IN_PLACE:
        continue
      if ins.op == "fusion" and _fusion_root_op(comps, ins) in IN_PLACE:
        continue
      yield comps, by_name, ins


READERS = ("dot", "gather", "custom-call")   # read only what they use: the attention dots, the commit's gather
_PASS_THROUGH = ("bitcast", "reshape", "copy-start", "get-tuple-element")


def _param_users_ok(comps, fused: str, index: int) -> bool:
  """Within fusion computation `fused`, parameter `index` reaches only READERS or in-place writes (through
  bitcasts / reshapes)."""
  instrs = comps.get(fused, [])
  param = next((i for i in instrs if i.op == "parameter" and re.search(rf"parameter\({index}\)", i.line)), None)
  if param is None:
    return False
  frontier, seen = [param.name], set()
  while frontier:
    name = frontier.pop()
    if name in seen:
      continue
    seen.add(name)
    for user in (i for i in instrs if name in i.operands):
      if user.op in _PASS_THROUGH:
        frontier.append(user.name)
      elif user.op not in READERS + IN_PLACE:
        return False
  return True


def loop_body_cache_passes(text: str, shapes) -> list[Instr]:
  """Ops inside any while body that read a whole buffer with dims in `shapes` (a layer's KV cache) other than
  the attention dots, gathers and in-place writes: a masked `where`, a reduction or an elementwise pass over
  the cache costs a full extra read of it every round. A fusion counts as a reader only if the cache
  parameter reaches something other than a dot / gather / in-place write inside it."""
  shapes = {tuple(s) for s in shapes}
  bad = []
  for comps, by_name, ins in _body_ops(text):
    if ins.op in READERS:
      continue
    big = [k for k, o in enumerate(ins.operands) if o in by_name and by_name[o].shape in shapes]
    if not big:
      continue
    m = re.search(r"calls=%?([\w.\-]+)", ins.line)
    if ins.op == "fusion" and m and all(_param_users_ok(comps, m.group(1), k) for k in big):
      continue
    bad.append(ins)
  return bad


COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def count_collectives(text: str) -> dict[str, int]:
  """Collective ops in an HLO module's text: {"all-reduce": n, ...} (async start/done pairs count once)."""
  out = {}
  for op in COLLECTIVES:
    n = len(re.findall(rf" {op}(?:-start)?\(", text))
    if n:
      out[op] = n
  return out
