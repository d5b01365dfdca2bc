"""The command line behind run.py: flags.py (the flags, their common checks, the objects they describe),
one module per --mode (run + validate) and modes.py, their registry."""
