"""The tuning stack, pure host-side arithmetic (nothing here runs a model): a draft's cost descriptor
(draft_cost), hardware profiles on disk (profiles), the fitted step-time model (stepfit), the cost model
(costmodel, batch_tail), the choices it makes (autotune), model shapes and HLO reading. What measures
(calibration, acceptance profiling, the context sweep) is in magicdec_jax/measure/."""
