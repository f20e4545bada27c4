"""Time a torchvision model layer by layer on a GPU, forward and backward (PyTorch + CUDA; no
TensorFlow, no Horovod, nothing of this repository imported, so it runs on a bare GPU machine).

``python benchmarks/gpu_layers.py --out DIR [--models vgg16:32,resnet50:64] [--precision fp32]``
writes ``DIR/<model>-<precision>.json`` (raw records); ``python -m benchmarks gpu-profile``
turns them into the simulator's profiles (``benchmarks/gpu_profile.py``).

How a layer is timed: one forward pass of the whole model records, in call order, every leaf
module's call and its input. Each call is then replayed alone: ``reps`` forwards with autograd
recording (as in training), then ``reps`` backwards of that forward (input and weight
gradients; none for the input of the model's first layer), each timed with CUDA events around
the whole loop (launches pipelined, as inside a model). Operations that are not modules (a
residual add, ``flatten``) are not replayed: the whole model's forward and its forward+backward
are timed too, and the converter scales the layers to those totals. The optimizer update
(SGD with momentum, ``foreach``) is timed on all parameters.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torchvision

IMAGE = 224
CLASSES = 1000


def _timed(fn, reps: int, warmup: int) -> float:
    """Seconds per call of ``fn`` (CUDA events around ``reps`` calls, after ``warmup``)."""
    for _ in range(warmup):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def _autocast(precision: str):
    """The forward's autocast context: bf16 for ``amp``, none for ``fp32``."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "amp")


def _calls(model: torch.nn.Module, x: torch.Tensor, precision: str) -> list[dict]:
    """Every leaf module's call in forward order: its name (``#k`` for its k-th reuse), the
    module and a detached copy of its input."""
    names = {m: n for n, m in model.named_modules()}
    calls: list[dict] = []
    seen: dict[str, int] = {}

    def hook(module, inputs, _output):
        name = names[module]
        seen[name] = seen.get(name, 0) + 1
        calls.append({"name": name if seen[name] == 1 else f"{name}#{seen[name]}",
                      "module": module, "input": inputs[0].detach().clone()})

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    with torch.no_grad(), _autocast(precision):
        model(x)
    for h in handles:
        h.remove()
    return calls


def _layer(call: dict, first: bool, precision: str, reps: int, warmup: int) -> dict:
    """One call replayed alone: forward and backward seconds, its parameters."""
    module = call["module"]
    inplace = getattr(module, "inplace", None)
    if inplace:
        module.inplace = False  # a leaf input cannot be overwritten under autograd
    x = call["input"].clone().requires_grad_(not first and call["input"].is_floating_point())
    params = [p for p in module.parameters(recurse=False) if p.requires_grad]
    with _autocast(precision):
        forward_s = _timed(lambda: module(x), reps, warmup)
        y = module(x)
    wrt = ([x] if x.requires_grad else []) + params
    backward_s = 0.0
    if wrt and y.requires_grad:
        g = torch.randn_like(y)
        backward_s = _timed(lambda: torch.autograd.grad(y, wrt, g, retain_graph=True),
                            reps, warmup)
    if inplace:
        module.inplace = True
    dense = ([module.in_features, module.out_features]
             if isinstance(module, torch.nn.Linear) else None)
    return {"name": call["name"], "type": type(module).__name__, "forward_s": forward_s,
            "backward_s": backward_s, "params": [list(p.shape) for p in params],
            "grad_bytes": sum(p.numel() * p.element_size() for p in params), "dense": dense}


def profile_model(name: str, batch: int, precision: str, reps: int, warmup: int) -> dict:
    """The raw record of one model: per-call layers, whole-model and update times."""
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None).cuda().train()
    x = torch.randn(batch, 3, IMAGE, IMAGE, device="cuda")
    labels = torch.randint(0, CLASSES, (batch,), device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def forward():
        with _autocast(precision):
            return loss_fn(model(x), labels)

    def step():
        model.zero_grad(set_to_none=True)
        forward().backward()

    whole_forward_s = _timed(forward, reps, warmup)
    whole_step_s = _timed(step, reps, warmup)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, foreach=True)
    step()
    update_s = _timed(opt.step, reps, warmup)
    calls = _calls(model, x, precision)
    layers = [_layer(c, i == 0, precision, reps, warmup) for i, c in enumerate(calls)]
    return {"format": "hvd-overlap-gpu-layers/1", "model": name, "batch_size": batch,
            "precision": precision, "image_size": IMAGE,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(), "host": platform.node(),
            "tf32_conv": torch.backends.cudnn.allow_tf32,
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "reps": reps,
            "whole_forward_s": whole_forward_s, "whole_step_s": whole_step_s,
            "update_s": update_s, "optimizer": "SGD momentum 0.9, foreach", "layers": layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", default="vgg16:32,resnet50:64,resnet101:64")
    ap.add_argument("--precision", default="fp32,amp", help="fp32 (PyTorch's defaults), amp")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    for spec in args.models.split(","):
        name, batch = spec.split(":")
        for precision in args.precision.split(","):
            t0 = time.time()
            rec = profile_model(name, int(batch), precision, args.reps, args.warmup)
            path = args.out / f"{name}-{precision}.json"
            path.write_text(json.dumps(rec, indent=1) + "\n")
            total = sum(la["forward_s"] + la["backward_s"] for la in rec["layers"])
            print(f"{name} b{batch} {precision}: step {rec['whole_step_s'] * 1e3:.2f} ms "
                  f"(forward {rec['whole_forward_s'] * 1e3:.2f}), layers alone "
                  f"{total * 1e3:.2f} ms over {len(rec['layers'])} calls, update "
                  f"{rec['update_s'] * 1e3:.2f} ms; {time.time() - t0:.0f} s -> {path}",
                  flush=True)
            del rec
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
