"""Sampling settings and the one filter that turns logits into probabilities.

Target (p) and draft (q) distributions both come from the same `Scores` (the row features' transform, then
`filter_logits`: `with_static_filter`), so temperature / top-k / top-p / min-p are always applied
identically to both.

The top-k and top-p cuts never sort the vocabulary. Each is a threshold on the row's temperature-scaled
logits, and the kept set is the sorted definition's:
  top-k: every logit >= the k-th largest (ties at the k-th value kept);
  top-p: every logit >= t*, the smallest logit whose strictly-greater mass is < top_p (the token that
         crosses the mass is kept; ties at t* kept).
Both are "the smallest value t with W(t) < bound", W(t) = the weight of the logits > t (weight 1 for top-k,
exp(logit - max) for top-p), a step function that falls as t rises. `_smallest_below` finds it exactly:
bisection narrows a bracket (lo, hi] (W(lo) >= bound > W(hi)) with one compare-and-sum pass over the row
per halving, until at most CANDIDATES logits lie inside; those are then the top CANDIDATES logits <= hi
(`lax.top_k`, a selection, not a sort), and a cumulative sum over them gives t* exactly. Halvings split the
values while they can and the float32 bit patterns (`float_to_key`) after, so the search ends on every
input, heavy ties included. Top-p starts from a bracket of width ~log(V / (1 - top_p)): t* > max +
log((1 - top_p) Z / V), since the V logits <= t* carry more than (1 - top_p) Z. Top-k with k <= CANDIDATES
is one `lax.top_k`. On a CPU each row is searched on its own (`lax.map`: its bracket ends as soon as it is
resolved, and one row's data stays in cache); accelerators search all rows at once, and so does a CPU
when the vocabulary is at most CANDIDATES (no halving runs: a per-row loop would only add its overhead).

Per-row settings: `Sampling` is static (the compiled loop specializes on it). A batch whose rows differ
(greedy rows next to sampled ones) passes `RowSampling`, the same settings as data [B], to
`filter_logits_rows` / `probabilities_rows`: one compiled program for any mix. Every cut is then a search
(k varies per row, so no static `lax.top_k`), and rows without a cut get threshold -inf. A row's kept set
and values are those of `filter_logits` with that row's settings (top-p up to float32 knife edges, as
between `filter_logits` compiled and eager).
"""
from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import backend
from magicdec_jax.options import check_number


# Names the way tokens are drawn (datagen fingerprints it): a data set resumed under another sampler would
# mix two sets of samples. rejection: the two-stage inverse CDF of `sample_without_replacement` with
# per-round random numbers; invariant: Gumbel-max with one noise vector per (stream, absolute position).
SAMPLER = {"rejection": "inverse-cdf-2", "invariant": "gumbel-max-position-1"}
MODES = tuple(SAMPLER)
NOISE_TAG = 0x6E6F6973        # folded into a row's key before the position: the invariant noise's stream


ROW_FIELDS = ("temperature", "top_k", "top_p", "min_p")     # what a row (a request) may set of its own


@dataclasses.dataclass(frozen=True)
class Sampling:
  """temperature 0 means greedy; top_k 0 means no top-k cut; top_p 1 means no nucleus cut; min_p 0 means no
  min-p cut (else, after the other cuts, tokens below min_p times the most likely one's probability go). invariant:
  drafter-invariant sampling (a token is the argmax of the filtered logits plus the noise of its
  position, shared by draft and target: `position_noise`); False: speculative rejection sampling.
  simulated_acceptance (benchmarks of random-weight models at a realistic acceptance): each speculative
  round's accepted path is replaced by a random walk accepting a node's child of rank k with probability
  v[k] (a chain: v[0]); the real acceptance still runs, so the round costs what it would.
  per_row: the rows' temperature / top-k / top-p / min-p are a RowSampling passed beside it (in the loop:
  the per-row sampling row feature's state, row_features/sampling.py; mixed batches: greedy rows are then
  sampled from one-hot distributions, which speculative sampling accepts exactly as greedy decoding
  would)."""
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  invariant: bool = False
  per_row: bool = False        # each row's own settings come as data (RowSampling); the fields above unused
  min_p: float = 0.0           # 0 means no cut; else drop tokens below min_p x the most likely one's probability
  simulated_acceptance: tuple[float, ...] = ()  # measurement only (verify.simulated_walk); (): real acceptance

  def __post_init__(self):
    for name in ROW_FIELDS:                      # ranges as a request's options have them (options.py)
      check_number(name, getattr(self, name))
    v = self.simulated_acceptance
    if not isinstance(v, tuple) or not all(isinstance(x, float) and 0.0 <= x <= 1.0 for x in v) or sum(v) > 1.0:
      raise ValueError(f"simulated_acceptance must be a tuple of floats in [0, 1] summing to at most 1, got {v!r:.80}")

  def over(self, **own) -> "Sampling":
    """A row's own settings (ROW_FIELDS; None: this one's) over this sampling, per_row off: each checked
    for its type (a number; top_k an integer) and then as Sampling checks it."""
    for name, v in own.items():
      if name not in ROW_FIELDS:
        raise ValueError(f"unknown sampling field {name!r} (a row sets {', '.join(ROW_FIELDS)})")
      if v is not None:
        check_number(name, v)
    base = dataclasses.replace(self, per_row=False)
    return dataclasses.replace(base, **{k: (int if k == "top_k" else float)(v) for k, v in own.items()
                                        if v is not None})

  @property
  def greedy(self) -> bool:
    """Every row greedy (static): the loop takes the argmax paths."""
    return self.temperature == 0.0 and not self.per_row

  @property
  def noisy_argmax(self) -> bool:
    """Tokens are argmaxes of filtered logits plus position noise (invariant sampling at temperature > 0)."""
    return self.invariant and not self.greedy


def position_noise(row_keys: jax.Array, positions: jax.Array, vocab: int) -> jax.Array:
  """Standard Gumbel noise [B, K, V] for each row's stream (row_keys [B]) at absolute positions [B, K]:
  one vector per (stream, position), whatever the batch, slot, round or draft. argmax(filtered logits +
  noise) is an exact sample of the filtered distribution (Gumbel-max)."""
  def one(key, pos):
    stream = jax.random.fold_in(key, NOISE_TAG)
    return jax.vmap(lambda p: jax.random.gumbel(jax.random.fold_in(stream, p), (vocab,)))(pos)
  return jax.vmap(one)(row_keys, positions)


def float_to_key(x: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (IEEE sign-magnitude to unsigned: flip all bits of negatives,
  only the sign bit of non-negatives). -0.0 and +0.0 get neighbouring keys; compare floats, not keys."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  sign = bits >> 31
  return bits ^ jnp.where(sign == 1, jnp.uint32(0xFFFFFFFF), jnp.uint32(0x80000000))


def key_to_float(k: jax.Array) -> jax.Array:
  """The inverse of `float_to_key`."""
  bits = jnp.where(k >> 31 == 1, k ^ jnp.uint32(0x80000000), k ^ jnp.uint32(0xFFFFFFFF))
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


CANDIDATES = 64     # logits left in the bracket when the search hands over to lax.top_k
VALUE_HALVINGS = 24  # halvings of the float values before the search halves bit patterns instead


def _search(x: jax.Array, w: jax.Array | None, bound: jax.Array, lo: jax.Array, hi: jax.Array) -> jax.Array:
  """x [R, V], w [R, V] or None (weight 1); bound, lo, hi [R] with W(lo) >= bound > W(hi) = 0,
  W(t) = the weight of the logits > t. -> [R, 1]: the smallest logit t with W(t) < bound."""
  n_cand = min(CANDIDATES, x.shape[-1])

  def inside(c):
    lo, hi, n_lo, n_hi, _, it = c
    return (n_lo - n_hi > n_cand) & (float_to_key(hi) - float_to_key(lo) > 1)

  def halve(c):
    lo, hi, n_lo, n_hi, w_hi, it = c
    k_lo, k_hi = float_to_key(lo), float_to_key(hi)
    by_value = lo + (hi - lo) * 0.5
    k_val = float_to_key(by_value)
    use_value = (it < VALUE_HALVINGS) & (k_val > k_lo) & (k_val < k_hi)
    mid = jnp.where(use_value, by_value, key_to_float(k_lo + (k_hi - k_lo) // 2))
    above = x > mid[:, None]
    n_mid = above.sum(-1, dtype=jnp.int32)
    w_mid = n_mid.astype(jnp.float32) if w is None else jnp.where(above, w, 0.0).sum(-1)
    active = inside(c)                         # rows already resolved keep their bracket
    up, down = active & (w_mid < bound), active & ~(w_mid < bound)
    return (jnp.where(down, mid, lo), jnp.where(up, mid, hi), jnp.where(down, n_mid, n_lo),
            jnp.where(up, n_mid, n_hi), jnp.where(up, w_mid, w_hi), it + 1)

  n_all = jnp.full(lo.shape, x.shape[-1], jnp.int32)        # an upper bound of the count above lo
  zero = jnp.zeros_like(n_all)
  lo, hi, _, _, w_hi, _ = jax.lax.while_loop(
      lambda c: inside(c).any(), halve, (lo, hi, n_all, zero, zero.astype(jnp.float32), jnp.int32(0)))
  # at most n_cand logits in (lo, hi] (or all of them equal to hi): the largest logits <= hi hold them
  cand, idx = jax.lax.top_k(jnp.where(x <= hi[:, None], x, -jnp.inf), n_cand)
  w_cand = jnp.ones_like(cand) if w is None else jnp.take_along_axis(w, idx, axis=-1)
  w_above = w_hi[:, None] + jnp.cumsum(w_cand, axis=-1) - w_cand    # W at each candidate (first of ties)
  ok = (cand > lo[:, None]) & (w_above < bound[:, None])
  return jnp.min(jnp.where(ok, cand, hi[:, None]), axis=-1, keepdims=True)


def _smallest_below(x: jax.Array, w: jax.Array | None, bound: jax.Array, lo: jax.Array,
                    hi: jax.Array) -> jax.Array:
  """`_search`, one row at a time on a CPU (lax.map: each row's bracket ends when that row is resolved,
  and its data stays in cache), all rows at once on an accelerator or when no row needs a search (at most
  CANDIDATES logits: the bracket starts resolved)."""
  if backend.name() != "cpu" or x.shape[0] == 1 or x.shape[-1] <= CANDIDATES:
    return _search(x, w, bound, lo, hi)
  if w is None:
    return jax.lax.map(lambda r: _search(r[0][None], None, *(a[None] for a in r[1:]))[0], (x, bound, lo, hi))
  return jax.lax.map(lambda r: _search(*(a[None] for a in r))[0], (x, w, bound, lo, hi))


def top_k_threshold(x: jax.Array, k: int) -> jax.Array:
  """x [R, V] float32 -> [R, 1]: the k-th largest value of each row (x >= it keeps the top k, ties kept)."""
  if k <= CANDIDATES:
    # min of the values, not the last one: slicing the last value lets XLA turn top_k into a full sort
    return jax.lax.top_k(x, k)[0].min(-1, keepdims=True)
  lo = key_to_float(float_to_key(x.min(-1)) - 1)           # below every value: all V are above it
  return _smallest_below(x, None, jnp.full(x.shape[:1], k, jnp.float32), lo, x.max(-1))


def top_p_threshold(x: jax.Array, top_p: float) -> jax.Array:
  """x [R, V] float32 (-inf = cut) -> [R, 1]: the smallest value t with mass(x > t) < top_p."""
  m = x.max(-1)
  e = jnp.exp(x - m[:, None])
  z = e.sum(-1)
  lo = m + jnp.log((1.0 - top_p) * z / x.shape[-1]) - 1.0     # t* is above this (1 nat of slack)
  return _smallest_below(x, e, top_p * z, lo, m)


def scaled(logits: jax.Array, temperature) -> jax.Array:
  """float32 (logits - their row's max) / temperature: the largest is exactly 0 at any temperature. Why:
  divided first, by a small compiled-in temperature (1e-9), XLA's rewrites round the quotients in two
  places apart (the largest exp term is no longer 1: inf and NaN probabilities)."""
  x = logits.astype(jnp.float32)
  return (x - jax.lax.stop_gradient(x.max(-1, keepdims=True))) / temperature


def filter_logits(logits: jax.Array, s: Sampling, rows: "RowSampling | None" = None) -> jax.Array:
  """float32 logits [..., V] -> temperature-scaled logits with the top-k / top-p / min-p cuts set to -inf (a per-row
  Sampling: each row's own, `filter_logits_rows`)."""
  if s.per_row:
    return filter_logits_rows(logits, rows)
  x = scaled(logits, s.temperature)
  shape = x.shape
  x = x.reshape(-1, shape[-1])
  if s.top_k and s.top_k < shape[-1]:
    x = jnp.where(x < top_k_threshold(x, s.top_k), -jnp.inf, x)
  if s.top_p < 1.0:
    x = jnp.where(x < top_p_threshold(x, s.top_p), -jnp.inf, x)
  if s.min_p > 0.0:
    x = jnp.where(x < min_p_threshold(x, s.min_p), -jnp.inf, x)
  return x.reshape(shape)


def min_p_threshold(x: jax.Array, min_p) -> jax.Array:
  """x [R, V] float32 (-inf = cut), min_p scalar or [R] in (0, 1] -> [R, 1]: the smallest logit whose
  probability is at least min_p times the most likely token's: max + log(min_p) (applied after top-k and
  top-p, as vLLM does; the most likely token always stays)."""
  return x.max(-1, keepdims=True) + jnp.reshape(jnp.log(jnp.asarray(min_p, jnp.float32)), (-1, 1))


def probabilities(logits: jax.Array, s: Sampling, rows: "RowSampling | None" = None) -> jax.Array:
  """float32 logits [..., V] -> float32 probabilities [..., V] after temperature, top-k and top-p (a
  per-row Sampling: each row's own, `probabilities_rows`)."""
  if s.per_row:
    return probabilities_rows(logits, rows)
  if s.greedy:
    return jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  return jax.nn.softmax(filter_logits(logits, s), axis=-1)


@flax.struct.dataclass
class RowSampling:
  """One `Sampling` per row as data (the per-row sampling row feature's state in the loop). A new mix of
  settings is new data, not a new compiled program."""
  temperature: jax.Array   # [B] float32 (0: a greedy row)
  top_k: jax.Array         # [B] int32 (0: no cut)
  top_p: jax.Array         # [B] float32 (1: no cut)
  min_p: jax.Array         # [B] float32 (0: no cut)

  @classmethod
  def of(cls, rows) -> "RowSampling":
    """One Sampling per row (each re-validated). invariant is a mode of the loop, not of a row: it must
    agree across the rows."""
    rows = [dataclasses.replace(r) for r in rows]       # replace re-runs Sampling's checks
    if not rows:
      raise ValueError("RowSampling.of needs at least one row")
    if len({r.invariant for r in rows}) > 1:
      raise ValueError("rows disagree on invariant: it is a mode of the whole loop")
    return cls(temperature=jnp.asarray(np.array([r.temperature for r in rows], np.float32)),
               top_k=jnp.asarray(np.array([min(r.top_k, 2**31 - 1) for r in rows], np.int32)),
               top_p=jnp.asarray(np.array([r.top_p for r in rows], np.float32)),
               min_p=jnp.asarray(np.array([r.min_p for r in rows], np.float32)))

  @classmethod
  def uniform(cls, s: Sampling, batch: int) -> "RowSampling":
    """The static `s` on every one of `batch` rows."""
    return cls.of([dataclasses.replace(s, per_row=False)] * batch)

  @classmethod
  def placeholder(cls, batch: int) -> "RowSampling":
    """`batch` greedy rows: what a loop state holds when its Sampling is not per-row (never read)."""
    return cls(temperature=jnp.zeros((batch,), jnp.float32), top_k=jnp.zeros((batch,), jnp.int32),
               top_p=jnp.ones((batch,), jnp.float32), min_p=jnp.zeros((batch,), jnp.float32))


def rows_over(a: jax.Array, lead: tuple[int, ...]) -> jax.Array:
  """a [B] -> lead [B, ...]: each row's value on every position of its row."""
  return jnp.broadcast_to(a.reshape(a.shape + (1,) * (len(lead) - 1)), lead)


def greedy_rows(rs: RowSampling) -> jax.Array:
  """-> bool [B]: the rows drawn by argmax (temperature 0)."""
  return rs.temperature == 0.0


def filter_logits_rows(logits: jax.Array, rs: RowSampling) -> jax.Array:
  """logits [B, ..., V] -> float32 [B, ..., V]: each row as `filter_logits` with its own settings (the
  positions of a row share them). Greedy rows are divided by 1 and cut as set: only their argmax is used,
  and `probabilities_rows` takes it from the raw logits. Top-k is exact for every k (a count search); top-p
  agrees with `filter_logits` except where a value's strictly-greater mass is within float32 rounding of
  top_p * Z, where float32 sums in another order may honestly disagree (and do: `filter_logits` eager and
  under jit already can)."""
  lead, v = logits.shape[:-1], logits.shape[-1]
  t = rows_over(rs.temperature, lead)
  x = scaled(logits, jnp.where(t == 0.0, 1.0, t)[..., None])
  x = x.reshape(-1, v)
  k = rows_over(rs.top_k, lead).reshape(-1)
  p = rows_over(rs.top_p, lead).reshape(-1)
  # top-k: the k-th largest value, found by the search for every row (exact for any k)
  cut_k = (k > 0) & (k < v)
  lo = key_to_float(float_to_key(x.min(-1)) - 1)           # below every value: all V are above it
  kth = _smallest_below(x, None, jnp.where(cut_k, k, 1).astype(jnp.float32), lo, x.max(-1))
  x = jnp.where(x < jnp.where(cut_k[:, None], kth, -jnp.inf), -jnp.inf, x)
  # top-p: `top_p_threshold` with a per-row top_p (rows without a cut search with 1/2, then are ignored)
  cut_p = p < 1.0
  p = jnp.where(cut_p, p, 0.5)
  m = x.max(-1)
  e = jnp.exp(x - m[:, None])
  z = e.sum(-1)
  lo = m + jnp.log((1.0 - p) * z / v) - 1.0                # t* is above this (1 nat of slack)
  tp = _smallest_below(x, e, p * z, lo, m)
  x = jnp.where(x < jnp.where(cut_p[:, None], tp, -jnp.inf), -jnp.inf, x)
  mp = rows_over(rs.min_p, lead).reshape(-1)                # min-p: last, as in filter_logits
  cut_m = mp > 0.0
  x = jnp.where(x < jnp.where(cut_m[:, None], min_p_threshold(x, jnp.where(cut_m, mp, 1.0)), -jnp.inf), -jnp.inf, x)
  return x.reshape(logits.shape)


def probabilities_rows(logits: jax.Array, rs: RowSampling) -> jax.Array:
  """logits [B, ..., V] -> float32 probabilities [B, ..., V]: `probabilities` with each row's settings
  (greedy rows: one-hot of the raw logits' argmax)."""
  one_hot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
  soft = jax.nn.softmax(filter_logits_rows(logits, rs), axis=-1)
  return jnp.where(rows_over(greedy_rows(rs), logits.shape[:-1])[..., None], one_hot, soft)


@dataclasses.dataclass(frozen=True)
class Scores:
  """What rows draw their next token from at some positions: logits x [B, ..., V] whose softmax is the
  distribution (-inf: a token that cannot come), and argmax [B] bool, the rows that take argmax(x) instead
  (greedy rows of a per-row sampling; None: no row does, or a static greedy loop, which argmaxes all).
  The row features transform it (row_features/: a mask, the per-row filters), the static sampling's
  filter last (`with_static_filter`); then target and draft read it alike, so verification compares p and
  q after the same transform."""
  x: jax.Array
  argmax: jax.Array | None = None

  def _argmax_rows(self) -> jax.Array:
    return rows_over(self.argmax, self.x.shape[:-1])[..., None]

  def probabilities(self) -> jax.Array:
    """float32 [B, ..., V]: softmax(x), one-hot at argmax(x) on argmax rows."""
    soft = jax.nn.softmax(self.x.astype(jnp.float32), axis=-1)
    if self.argmax is None:
      return soft
    one_hot = jax.nn.one_hot(jnp.argmax(self.x, axis=-1), self.x.shape[-1], dtype=jnp.float32)
    return jnp.where(self._argmax_rows(), one_hot, soft)

  def noisy(self, noise: jax.Array) -> jax.Array:
    """float32 scores whose argmax is the token (invariant sampling): x plus Gumbel noise (broadcast
    against x), argmax rows x alone (their token is greedy decoding's)."""
    x = self.x.astype(jnp.float32)
    return x + noise if self.argmax is None else jnp.where(self._argmax_rows(), x, x + noise)

  def log_probabilities(self) -> jax.Array:
    """float32 log_softmax(x): each token's log-probability under the distribution it is drawn from (an
    argmax row's: its x, the model's own distribution as far as the features leave it)."""
    return jax.nn.log_softmax(self.x.astype(jnp.float32), axis=-1)


def with_static_filter(scores: Scores, s: Sampling) -> Scores:
  """The static sampling's temperature and cuts applied to scores (`filter_logits`); nothing where the
  loop is greedy (argmax of x) or per-row (the per-row sampling feature filters each row)."""
  if s.greedy or s.per_row:
    return scores
  return Scores(filter_logits(scores.x, s), scores.argmax)


SAMPLE_BLOCK = 256   # tokens per block of the two-stage inverse-CDF draw


def _pick(w: jax.Array, u: jax.Array) -> jax.Array:
  """w [R, K] >= 0, u [R] in [0, 1) -> [R] the index i with cumsum(w)[i-1] <= u * sum(w) < cumsum(w)[i]:
  always an entry of positive weight (float rounding past the end falls back to the last such entry)."""
  c = jnp.cumsum(w, axis=-1)
  i = (c <= (u * c[:, -1])[:, None]).sum(-1, dtype=jnp.int32)
  last = jnp.max(jnp.where(w > 0, jnp.arange(w.shape[-1], dtype=jnp.int32), 0), axis=-1)
  return jnp.where(i < w.shape[-1], i, last)


def sample_without_replacement(key: jax.Array, probs: jax.Array, n: int) -> jax.Array:
  """n distinct tokens per row in draw order, each drawn from probs [..., V] (keys [...]) renormalized over
  the tokens not yet drawn: sequential draws without replacement (the order Gumbel top-n would give).

  Each draw is an inverse-CDF draw in two stages, so it reads the vocabulary once per call instead of
  generating V random numbers: a block of SAMPLE_BLOCK tokens with probability of its mass (one uniform),
  then a token inside it with probability of its share of the block (a second, fresh uniform). Two 24-bit
  uniforms resolve a token's probability to ~1e-7 of its block's mass, not of the whole distribution.
  """
  lead, v = probs.shape[:-1], probs.shape[-1]
  p = probs.reshape(-1, v).astype(jnp.float32)
  r = p.shape[0]
  block = min(SAMPLE_BLOCK, v)           # a vocabulary of one block is not padded to SAMPLE_BLOCK
  nb = -(-v // block)
  blocks = jnp.pad(p, ((0, 0), (0, nb * block - v))).reshape(r, nb, block)
  block_mass = blocks.sum(-1)                                                     # [R, nb]
  u = jax.vmap(lambda k: jax.random.uniform(k, (n, 2)))(key.reshape(-1))          # [R, n, 2]
  rows = jnp.arange(r)
  in_block = jnp.arange(block, dtype=jnp.int32)
  drawn = []
  for j in range(n):
    b = _pick(block_mass, u[:, j, 0])
    inner = jnp.take_along_axis(blocks, b[:, None, None], axis=1)[:, 0]          # [R, BLOCK]
    for t in drawn:                                                               # earlier draws removed
      inner = jnp.where(b[:, None] * block + in_block == t[:, None], 0.0, inner)
    i = _pick(inner, u[:, j, 1])
    drawn.append(b * block + i)
    if j + 1 < n:
      block_mass = block_mass.at[rows, b].set(jnp.where(in_block == i[:, None], 0.0, inner).sum(-1))
  return jnp.stack(drawn, -1).reshape(lead + (n,))


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
  """One token per row from probabilities [..., V] (keys [...] of the same leading shape)."""
  return sample_without_replacement(key, probs, 1)[..., 0]
