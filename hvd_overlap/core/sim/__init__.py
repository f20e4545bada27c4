"""The step-time simulator, split by concern; ``hvd_overlap.core.simulate`` re-exports it."""
