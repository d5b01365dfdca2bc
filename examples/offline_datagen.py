"""Offline data generation from Python (what `run.py --mode=datagen` does), resumable and crash-safe.

  python examples/offline_datagen.py OUT.jsonl [MODEL]
Writes a few chat prompts to OUT.jsonl.in, then generates 2 samples each; run it twice: the second run
finds every (id, sample) already written and generates nothing.
"""
import json
import sys

from magicdec_jax import StreamingDraft, datagen
from magicdec_jax.cli import flags as cli_flags

out = sys.argv[1] if len(sys.argv) > 1 else "datagen_example.jsonl"
model = cli_flags.load(sys.argv[2] if len(sys.argv) > 2 else "smollm2-135m")
questions = ["Who is Hamlet?", "Write one line of verse about the sea.", "What is a sonnet?"]
with open(out + ".in", "w") as f:
  for i, q in enumerate(questions):
    f.write(json.dumps({"id": f"q{i}", "messages": [{"role": "user", "content": q}]}) + "\n")
summary = datagen.run(model, out + ".in", out, max_new_tokens=48, batch_size=4, num_samples=2,
                      temperature=0.8, top_p=0.95, seed=1, draft=StreamingDraft(sink=4, window=64), gamma=3)
print(json.dumps(summary, indent=1))
