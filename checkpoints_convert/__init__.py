"""Checkpoint conversion from the command line: `python -m checkpoints_convert --src SRC --dst DST`.

A thin wrapper: the logic is `magicdec_jax.checkpoints.convert`, the same one `run.py --mode=convert` calls.
"""
from magicdec_jax.checkpoints import convert

__all__ = ["convert"]
