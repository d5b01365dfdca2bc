"""The GPU harness: random weights at real shapes through the engine's loop, acceptance simulated."""
