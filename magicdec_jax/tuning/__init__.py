"""The tuning stack: step-time measurement (calibrate, stepfit), the cost model (costmodel, batch_tail),
the choices it makes (autotune), model shapes, acceptance profiling, the context sweep and HLO reading."""
