"""Single steps and rounds: a round against its steps, prefill against a matmul, families, ours against HF."""
