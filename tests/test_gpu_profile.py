"""GPU layer timings (benchmarks/gpu_layers.py's records) as simulator profiles, and the
shipped H200 profiles made from them."""

import copy
import json

import pytest
from click.testing import CliRunner

from benchmarks.cli import main as lab
from benchmarks.gpu_profile import profile_name, to_profile
from hvd_overlap.core.sim.profile import load_profile
from hvd_overlap.core.simulate import Cluster, simulate

RAW = {
    "format": "hvd-overlap-gpu-layers/1", "model": "toy", "batch_size": 8, "precision": "fp32",
    "image_size": 32, "device": "NVIDIA H200", "torch": "2.11.0", "torchvision": "0.26.0",
    "cuda": "13.0", "cudnn": 91000, "tf32_conv": True, "tf32_matmul": False, "reps": 5,
    "whole_forward_s": 0.006, "whole_step_s": 0.018, "update_s": 0.001,
    "optimizer": "SGD momentum 0.9, foreach",
    "layers": [
        {"name": "conv", "type": "Conv2d", "forward_s": 0.002, "backward_s": 0.002,
         "params": [[4, 3, 3, 3], [4]], "grad_bytes": 4 * 112, "dense": None},
        {"name": "relu", "type": "ReLU", "forward_s": 0.001, "backward_s": 0.001,
         "params": [], "grad_bytes": 0, "dense": None},
        {"name": "fc", "type": "Linear", "forward_s": 0.001, "backward_s": 0.003,
         "params": [[10, 16], [10]], "grad_bytes": 4 * 170, "dense": [16, 10]},
        {"name": "relu#2", "type": "ReLU", "forward_s": 0.001, "backward_s": 0.002,
         "params": [], "grad_bytes": 0, "dense": None},
    ]}


def test_layers_are_scaled_to_the_whole_model_and_keep_their_gradients():
    prof = to_profile(RAW)
    assert prof.model == "toy-h200" and prof.batch_size == 8
    assert sum(la.forward_s for la in prof.layers) == pytest.approx(0.006)
    assert sum(la.backward_s for la in prof.layers) == pytest.approx(0.012)
    assert prof.compute_s == pytest.approx(0.019)  # the measured step plus the update
    # proportions within a pass are the replay's
    assert prof.layers[2].backward_s / prof.layers[0].backward_s == pytest.approx(1.5)
    assert prof.grad_bytes == 4 * (112 + 170)
    assert [la.tensors for la in prof.layers] == [2, 0, 2, 0]
    assert prof.layers[2].dense == (16, 10) and prof.layers[0].dense is None
    assert prof.meta["device"] == "NVIDIA H200" and "PyTorch 2.11.0" in prof.meta["framework"]


def test_a_reused_module_carries_its_parameters_once():
    raw = copy.deepcopy(RAW)
    raw["layers"][3] = {**raw["layers"][2], "name": "fc#2"}
    prof = to_profile(raw)
    assert prof.grad_bytes == 4 * (112 + 170)
    assert prof.layers[3].dense is None and prof.layers[3].tensors == 0


def test_names_and_refusals():
    assert profile_name({**RAW, "precision": "amp", "device": "NVIDIA A100-SXM4-80GB"}) \
        == "toy-a100sxm480gb-amp"
    with pytest.raises(ValueError, match="gpu_layers.py"):
        to_profile({**RAW, "format": "hvd-overlap-profile/1"})


def test_the_lab_command_writes_loadable_profiles(tmp_path):
    raw = tmp_path / "toy-fp32.json"
    raw.write_text(json.dumps(RAW))
    res = CliRunner().invoke(lab, ["gpu-profile", str(raw), "--out", str(tmp_path / "p")])
    assert res.exit_code == 0, res.output
    assert "toy-h200: 4 layers" in res.output
    assert load_profile(tmp_path / "p" / "toy-h200.json") == to_profile(RAW)


@pytest.mark.parametrize("name,trainable", [
    ("vgg16-h200", 138_357_544), ("vgg16-h200-amp", 138_357_544),
    ("resnet50-h200", 25_557_032), ("resnet50-h200-amp", 25_557_032),
    ("resnet101-h200", 44_549_160), ("resnet101-h200-amp", 44_549_160)])
def test_shipped_gpu_profiles(name, trainable):
    prof = load_profile(name)
    assert prof.meta["source"] == "measured-gpu" and prof.meta["device"] == "NVIDIA H200"
    assert prof.grad_bytes == 4 * trainable  # torchvision's parameter counts
    assert prof.compute_s == pytest.approx(prof.meta["whole_step_s"] + prof.update_s)
    dense = [la.dense for la in prof.layers if la.dense]
    assert dense[-1] == (4096 if name.startswith("vgg") else 2048, 1000)
    r = simulate(prof, "horovod", Cluster(8, 10e9 / 8, 5e-5))
    assert 0 < r.efficiency < 1
