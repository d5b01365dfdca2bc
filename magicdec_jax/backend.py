"""What the backend decides, resolved once: the shapes fixed-shape numerics compute at, and the default numerics.

A backend picks its algorithms (matmul blocking, how a reduction is vectorised or split over threads) from the
shapes of the operands, so a row's result depends on what else is computed with it. `FixedShapes` names, per
backend, the shapes at which it does not: the target is computed only at those (layers/invariant.py). The
values are the backend's measured algorithm classes ([docs](../docs/how-it-works.md#fixed-shape-numerics-bitwise-plain-decoding));
`fixed_shapes()` is read when a config is made (config.py) and travels in it, so layers never ask the backend.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp


ATTENTIONS = ("xla", "pallas_triton", "pallas_interpret")


@dataclasses.dataclass(frozen=True)
class FixedShapes:
  """The shapes of fixed-shape numerics.

  Token-wise stages (norms, projections, RoPE, the MLP, the LM head) of a call of m tokens with rows (lo, hi):
  m < lo: one call padded up to lo tokens; lo <= m <= hi: one call of m tokens; m > hi: calls of hi tokens
  and one of the rest (padded up to lo). So every call's row count lies in [lo, hi], a range in which the
  backend computes a row the same whatever the count (lo == hi: one fixed count, the choice where nothing
  better is known). Attention: query tiles of `query_tokens` tokens (x the G heads of a KV group), a single
  shorter tile padded to a whole one when `pad_query_tile` (else to 2 rows and to `tile_floor` elements per
  slot: query_rows); values summed over a prefix and a tail of
  `tail_blocks` blocks of `key_block` slots (layers/invariant.tiled_attention). `attention` picks who computes
  a linear cache's prefix + tree attention at these shapes: "xla" (layers/invariant.py), "pallas_triton" or
  "pallas_interpret" (the Pallas kernel pallas/fixed_attention.py, which reads the cache in splits of
  `split_slots` slots; the interpreter for CPU tests): a decision made here, once, never by a layer. A prefill
  chunk's attention (layers/invariant.chunk_attention) goes in tiles of `prefill_tile` = (query tokens, key
  positions), aligned to positions, so a prompt's K/V are the same whatever the chunk."""
  decode_rows: tuple[int, int]     # (lo, hi) tokens per token-wise call of a decode round
  prefill_rows: tuple[int, int]    # (lo, hi) tokens per token-wise call of a prefill chunk
  query_tokens: int = 4            # query tokens per attention tile
  pad_query_tile: bool = True      # pad a single tile of fewer tokens up to query_tokens
  tile_floor: int = 0              # an unpadded tile's rows x head dim at least this (smaller dots round otherwise)
  key_block: int = 64              # slots per block of the attention's value sums (cache sizes round to it)
  tail_blocks: int = 2             # blocks of a query's canonical tail: rounds of depth <= (this - 1) blocks
  xla_options: tuple[tuple[str, object], ...] = ()   # compiler options the shapes are measured under
  prefill_xla_options: tuple[tuple[str, object], ...] = ()   # options a prefill executable adds to those
  attention: str = "xla"           # "xla" | "pallas_triton" | "pallas_interpret": the fixed-shape attention
  split_slots: int = 2048          # slots per KV split of the Pallas kernel (a size: a multiple of key_block)
  prefill_tile: tuple[int, int] = (64, 256)   # a prefill chunk's attention: (query tokens, key positions) per tile
  slot_multiple: int = 1           # a linear cache's slot count is a multiple of this (and of key_block)
  data_shards: int = 1             # the mesh's data axis: a token-wise call's rows are split over it

  @property
  def max_depth(self) -> int:
    """The deepest chain or tree a round verifies bitwise: its tokens sit in the canonical tail's
    (tail_blocks - 1) key blocks."""
    return (self.tail_blocks - 1) * self.key_block

  def __post_init__(self):
    for name in ("decode_rows", "prefill_rows"):
      lo, hi = getattr(self, name)
      if not 1 <= lo <= hi:
        raise ValueError(f"FixedShapes.{name} must be (lo, hi) with 1 <= lo <= hi, got {(lo, hi)}")
    if self.query_tokens < 1 or self.key_block < 1 or self.key_block & (self.key_block - 1) or self.tail_blocks < 2:
      raise ValueError(f"FixedShapes needs query_tokens >= 1, a power-of-two key_block and tail_blocks >= 2, "
                       f"got {self.query_tokens}, {self.key_block}, {self.tail_blocks}")
    if self.attention not in ATTENTIONS:
      raise ValueError(f"FixedShapes.attention must be one of {ATTENTIONS}, got {self.attention!r}")
    if min(self.prefill_tile) < 1:
      raise ValueError(f"FixedShapes.prefill_tile must be two sizes >= 1, got {self.prefill_tile}")
    if self.split_slots < self.key_block or self.split_slots % self.key_block:
      raise ValueError(f"FixedShapes.split_slots={self.split_slots} must be a multiple of key_block={self.key_block}")

  def query_rows(self, tokens: int, group: int, head_dim: int) -> int:
    """The rows of a single query tile of `tokens` tokens x `group` heads (a KV group) left unpadded:
    whole tokens, at least 2 rows and at least tile_floor / head_dim."""
    return max(tokens, -(-2 // group), -(-self.tile_floor // (group * head_dim))) * group

  @property
  def cache_multiple(self) -> int:
    """What a linear cache's slot count is rounded to: whole key blocks, and the slot counts at which the
    prefix's one dot over every slot (a contraction over the slots) sums a row the same."""
    return math.lcm(self.key_block, self.slot_multiple)

  def compiler_options(self, prefill: bool = False) -> dict[str, object]:
    """The XLA options of a decode executable, or of a prefill's (`prefill`: with prefill_xla_options; the
    HLO passes either disables are all disabled)."""
    return merged_options(dict(self.xla_options), dict(self.prefill_xla_options) if prefill else {})

  def rows(self, prefill: bool) -> tuple[int, int]:
    """(lo, hi) for the token-wise calls of a prefill chunk or a decode round, both times data_shards, so
    that each shard's part lies in (lo, hi)."""
    lo, hi = self.prefill_rows if prefill else self.decode_rows
    return lo * self.data_shards, hi * self.data_shards


DISABLED_PASSES = "xla_disable_hlo_passes"   # its value: a comma-separated list of HLO pass names


def merged_options(*options: Mapping[str, object]) -> dict[str, object]:
  """XLA options, later ones winning, except that the HLO passes any of them disables are all disabled."""
  out: dict[str, object] = {}
  for opts in options:
    for key, value in opts.items():
      if key == DISABLED_PASSES and key in out:
        names = [n for n in f"{out[key]},{value}".split(",") if n]
        value = ",".join(dict.fromkeys(names))
      out[key] = value
  return out


# XLA:CPU fuses elementwise producers into its YNNPACK dots and reductions by the context they sit in, so
# the same rows computed in another program could round differently; with YNNPACK kept to standalone dots
# (`CPU_FUSION`) a dot computes a row the same for any 2..32 rows and for any 33..4096 (one row is a third
# algorithm), and attention's dots the same for any batch, 2..64 query rows (at head dim 8: 8..64, so a tile
# holds at least 64 elements a slot: `tile_floor`) and any slot count, except that a
# dot contracting over the slots (the prefix's values) sums a row the same only over slot counts that are
# multiples of 64 (float32: 48 or 80 slots round otherwise than 64 or 320)
# (docs/how-it-works.md#fixed-shape-numerics-bitwise-plain-decoding). XLA:CPU's own row reductions vectorise
# by the program around them (what is fused into them), so the sums a row's bits depend on (a norm's mean of
# squares, attention's probability sums) are fixed trees of adds or dots in the layers. XLA:CPU's tree
# reduction rewriter is off: it turns a max over thousands of slots into a reduce-window that costs more than
# the reduction (docs/measurements.md#ar-step-profile). A prefill chunk's attention goes in tiles of 64
# queries x 512 key positions: as fast as the backend's own prefill at long prompts
# (docs/measurements.md#prefill-tile). At XLA:CPU's default settings its while-loop simplifier compiles the
# chunk's attention loop by the program around it, so a prompt's K/V depended on its chunk size; the prefill
# executable runs without that pass (docs/decisions.md#cpu-opt-preset).
CPU_PREFILL = (("xla_disable_hlo_passes", "simplify-while-loops"),)
CPU_FUSION = (("xla_cpu_experimental_ynn_fusion_type", "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"),
              ("xla_allow_excess_precision", False),
              ("xla_disable_hlo_passes", "tree_reduction_rewriter"))
CPU = FixedShapes(decode_rows=(8, 32), prefill_rows=(256, 2048), query_tokens=8, pad_query_tile=False, tile_floor=64,
                  key_block=16, xla_options=CPU_FUSION, prefill_xla_options=CPU_PREFILL,
                  slot_multiple=64, prefill_tile=(64, 512))
# Accelerators: one fixed count (a projection reads its weights once up to 128 rows: a prediction); attention
# in the Triton kernel; GEMMs with one algorithm per shape whatever the program or the process (autotuning
# off: it picks by timing; no atomics; bf16 intermediates rounded where the program says, whatever fuses).
GPU_DETERMINISM = (("xla_gpu_autotune_level", 0), ("xla_gpu_exclude_nondeterministic_ops", True),
                   ("xla_allow_excess_precision", False))
ACCELERATOR = FixedShapes(decode_rows=(128, 128), prefill_rows=(256, 256), query_tokens=4, pad_query_tile=True,
                          key_block=64, xla_options=GPU_DETERMINISM, attention="pallas_triton", split_slots=2048)
FIXED_SHAPES = {"cpu": CPU}
DEFAULT_NUMERICS = {"cpu": "invariant"}   # numerics when the settings name none (else "fast")


def name() -> str:
  """The default backend's platform name ("cpu", "gpu", "tpu")."""
  return jax.default_backend()


def fixed_shapes(platform: str | None = None) -> FixedShapes:
  """The fixed shapes of `platform` (default: the default backend's), without the compiler options this
  jaxlib does not know."""
  fixed = FIXED_SHAPES.get(platform or name(), ACCELERATOR)
  known = {f: tuple(o for o in getattr(fixed, f) if option_known(*o)) for f in ("xla_options", "prefill_xla_options")}
  return dataclasses.replace(fixed, **known)


@functools.lru_cache(maxsize=None)
def option_known(option: str, value: str) -> bool:
  """Whether this jaxlib's compiler takes `option` = `value` (a tiny computation compiled with it, once)."""
  try:
    jax.jit(lambda x: x + 1).lower(jnp.zeros((2,), jnp.float32)).compile(compiler_options={option: value})
    return True
  except Exception:  # noqa: BLE001  (an unknown option or value: XLA raises its own error types)
    return False


def default_numerics(platform: str | None = None) -> str:
  """The numerics a run gets on `platform` when its settings name none: fixed shapes ("invariant") where
  their measured cost is within the project's goals, else the backend's own ("fast")."""
  return DEFAULT_NUMERICS.get(platform or name(), "fast")
