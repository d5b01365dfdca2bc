"""The command line behind run.py: flags, and one module per --mode."""
