"""The compiled core inside your own `jax.jit`: prefill + the speculative while_loop as one function.

`generate` is a host-side convenience (validation, tokenization, buckets, stats). Pipelines that already
hold token arrays on device can call the pure pieces directly: `loop.prefill_with_draft`,
`loop.initial_state` and `loop.decode` are functions of arrays and static settings, so they trace into an
outer `jax.jit` (or a `shard_map`, or a larger step function) like any other JAX code.

  python examples/jitted_core.py [MODEL]        # default smollm2-135m; 'random-tiny' needs no weights
"""
import functools
import sys

import jax
import jax.numpy as jnp
import numpy as np

from magicdec_jax import StreamingDraft, generate, loop
from magicdec_jax.cli import flags as cli_flags
from magicdec_jax.sampling import Sampling
from magicdec_jax.trees import Tree

model = cli_flags.load(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
cfg = model.config
spec = StreamingDraft(sink=4, window=64).spec                  # hashable: a static argument
tree = Tree.chain(3)                                             # gamma = 3 (any trees.Tree works)
MAX_NEW = 32


@functools.partial(jax.jit, static_argnames=("num_slots",))
def speculative_decode(params, tokens, lengths, key, *, num_slots):
  """tokens [B, P] right-padded, lengths [B] -> new tokens [B, M] (-1 padded) and their counts [B]."""
  b = tokens.shape[0]
  target, ring = loop.prefill_with_draft(params, None, tokens, lengths, cfg=cfg, spec=spec, tree=tree,
                                         num_slots=num_slots, chunk=tokens.shape[1])
  state = loop.initial_state(tokens, lengths, max_new=jnp.full((b,), MAX_NEW, jnp.int32),
                             eos=jnp.asarray([-1], jnp.int32), keys=jax.random.split(key, b),
                             target=target, ring=ring, out_len=MAX_NEW + tree.num_nodes, tree=tree)
  state = loop.decode(params, None, state, cfg=cfg, spec=spec, tree=tree, sampling=Sampling())  # greedy
  return state.out, state.n_out


prompts = [[1 + (7 * i + 3 * j) % 50 for j in range(n)] for i, n in enumerate((40, 25))]
tokens = np.zeros((2, 64), np.int32)
for i, p in enumerate(prompts):
  tokens[i, :len(p)] = p
lengths = jnp.asarray([len(p) for p in prompts], jnp.int32)
out, n_out = speculative_decode(model.params, jnp.asarray(tokens), lengths, jax.random.key(0),
                                num_slots=64 + MAX_NEW + tree.num_nodes + 1)
mine = [np.asarray(out)[i, :int(n_out[i])].tolist() for i in range(2)]
ref = generate(model, prompts, max_new_tokens=MAX_NEW, eos_token_id=[]).tokens    # plain autoregressive
print("same tokens as autoregressive generate:", mine == ref)
