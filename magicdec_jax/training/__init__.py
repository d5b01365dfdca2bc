"""The training stack: draft distillation and feature-head training, and their data."""
