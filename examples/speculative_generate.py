"""MagicDec from Python: the same prompts autoregressively and with StreamingLLM self-speculation.

  python examples/speculative_generate.py [MODEL]      # default smollm2-135m; 'random-tiny' needs no weights
Greedy speculative decoding is lossless, so both runs print the same text.
"""
import sys

from magicdec_jax import StreamingDraft, generate, textdata
from magicdec_jax.cli import flags as cli_flags

model = cli_flags.load(sys.argv[1] if len(sys.argv) > 1 else "smollm2-135m")
prompts = textdata.shakespeare_prompts(model.tokenizer, 2, 512)          # two 512-token windows of text
auto = generate(model, prompts, max_new_tokens=32)
spec = generate(model, prompts, max_new_tokens=32, draft=StreamingDraft(sink=4, window=128), gamma=3)
print("identical:", auto.tokens == spec.tokens)
print("acceptance rate %.3f, mean accepted length %.2f" % (spec.stats["acceptance_rate"],
                                                           spec.stats["mean_accepted_length"]))
print("continuation:", spec.texts[0] if spec.texts else spec.tokens[0])
