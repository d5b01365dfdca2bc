"""The command line behind run.py: flags.py (the flags and their common checks), build.py (the objects they
describe), one module per --mode (run + validate) and modes.py, their registry."""
