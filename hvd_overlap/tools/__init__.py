"""The tools around the plugin: the ``hvd-overlap`` CLI, the benchmark, the simulator and its
profiles and calibration, timeline analysis, and the emulated networks (namespaces, hosts)."""
