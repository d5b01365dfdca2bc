"""The measuring layer: code that runs models to measure what the cost model and the choosers take as
given. `calibrate.py` times this device's target and draft steps and fits a hardware profile (the profile
file itself is read and written by `tuning/profiles.py`, which runs nothing); `acceptance.py` replays a
draft against its target over real text for a Sequoia acceptance vector; `sweep.py` measures speedups over
a batch x context grid against the cost model's prediction. It sits above the drafts, the model and the
engine (it runs them) and below the command line; nothing in `drafts/` or `tuning/` imports it."""
