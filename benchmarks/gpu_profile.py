"""GPU layer timings (``benchmarks/gpu_layers.py``'s raw records) as the simulator's profiles.

Each replayed call becomes a layer in forward order; its forward and backward seconds are
scaled so that they add up to the whole model's measured forward and backward (what the
replay cannot see: residual adds, ``flatten``, the loss, the overlap of small kernels'
launches). A module called more than once (torchvision's shared ReLUs) carries its
parameters on its first call only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvd_overlap.core.sim.profile import Layer, Profile

RAW_FORMAT = "hvd-overlap-gpu-layers/1"


def _device_slug(device: str) -> str:
    """``NVIDIA H200`` -> ``h200``."""
    return device.lower().replace("nvidia", "").strip().split()[0].replace("-", "")


def profile_name(raw: dict[str, Any]) -> str:
    """``vgg16-h200`` for PyTorch's fp32 defaults, ``vgg16-h200-amp`` for bf16 autocast."""
    suffix = "" if raw["precision"] == "fp32" else f"-{raw['precision']}"
    return f"{raw['model']}-{_device_slug(raw['device'])}{suffix}"


def to_profile(raw: dict[str, Any]) -> Profile:
    """The simulator's profile of one raw record (see the module's docstring)."""
    if raw.get("format") != RAW_FORMAT:
        raise ValueError(f"not a record of benchmarks/gpu_layers.py (format "
                         f"{raw.get('format')!r}, expected {RAW_FORMAT!r})")
    calls = raw["layers"]
    forward = sum(c["forward_s"] for c in calls)
    backward = sum(c["backward_s"] for c in calls)
    f_scale = raw["whole_forward_s"] / forward
    b_scale = (raw["whole_step_s"] - raw["whole_forward_s"]) / backward
    layers = []
    for c in calls:
        owner = "#" not in c["name"]
        layers.append(Layer(
            name=c["name"], forward_s=c["forward_s"] * f_scale,
            backward_s=c["backward_s"] * b_scale,
            grad_bytes=c["grad_bytes"] if owner else 0,
            tensors=len(c["params"]) if owner else 0,
            dense=tuple(c["dense"]) if c["dense"] and owner else None))
    framework = (f"PyTorch {raw['torch']}, torchvision {raw['torchvision']}, CUDA "
                 f"{raw['cuda']}, cuDNN {raw['cudnn']}")
    precision = ("fp32 (PyTorch's defaults: TF32 convolutions "
                 f"{'on' if raw['tf32_conv'] else 'off'}, TF32 matmul "
                 f"{'on' if raw['tf32_matmul'] else 'off'})" if raw["precision"] == "fp32"
                 else "bf16 autocast (fp32 weights and gradients)")
    meta = {"source": "measured-gpu", "device": raw["device"], "framework": framework,
            "precision": precision, "input_shape": [raw["image_size"]] * 2 + [3],
            "whole_step_s": raw["whole_step_s"], "whole_forward_s": raw["whole_forward_s"],
            "optimizer_update": raw["optimizer"], "reps": raw["reps"],
            "layer_scale": {"forward": round(f_scale, 4), "backward": round(b_scale, 4)},
            "note": "per-layer forward and backward timed alone with CUDA events "
                    "(benchmarks/gpu_layers.py), scaled to the whole model's measured forward "
                    "and backward; gradient bytes exact; torchvision layer names"}
    return Profile(model=profile_name(raw), batch_size=int(raw["batch_size"]),
                   layers=tuple(layers), update_s=raw["update_s"], meta=meta)


def convert(raw_paths: list[Path], out_dir: Path) -> list[tuple[Path, Profile]]:
    """Write one profile per raw record into ``out_dir``; returns what was written."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    written = []
    for path in raw_paths:
        prof = to_profile(json.loads(Path(path).read_text()))
        out = Path(out_dir) / f"{prof.model}.json"
        prof.save(out)
        written.append((out, prof))
    return written
