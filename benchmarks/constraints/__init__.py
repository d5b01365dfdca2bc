"""Structured output: what compiling a constraint costs, and constrained decoding against free decoding."""
