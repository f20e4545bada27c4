"""The tools around the plugin: the ``hvd-overlap`` CLI (plan, timeline, profile, simulate), the
per-layer profiles, timeline analysis and the benchmark models. The benchmark harness, emulated
networks, calibration and results generators are the repository's ``benchmarks`` (not shipped)."""
