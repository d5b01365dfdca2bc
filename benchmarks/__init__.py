"""Benchmarks of magicdec_jax, grouped by what they measure: decode/ (end to end), steps/ (single steps and
rounds), drafts/ (acceptance, trained drafts), gpu/ (the GPU harness). Each module runs from the repository
root as `python -m benchmarks.GROUP.NAME [...]` (its docstring gives the usage; `--smoke` runs a random tiny
model in seconds); `benchmarks.common` is the shared harness; results/ holds the runs the docs cite
(results/INDEX.md). What they measured: docs/measurements.md."""
