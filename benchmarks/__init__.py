"""Benchmarks of magicdec_jax: each module runs from the repository root as `python -m benchmarks.NAME [...]`
(its docstring gives the usage; `--smoke` where a module has it runs a random tiny model in seconds).
`benchmarks.common` is the shared harness; results/ holds the recorded runs."""
