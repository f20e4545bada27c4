"""What the wheel holds, the one version number, and what installing it pulls: nothing of the
user's stack (TensorFlow, Keras, tf-keras, numpy, Horovod), whichever TensorFlow they have.

The install checks are pip's own dry run (``--report``) into empty venvs that hold stand-ins
for an existing environment (a ``tensorflow`` or ``tensorflow-cpu``, Keras, numpy, Horovod,
click: metadata only), offline (``--no-index``): anything the wheel required beyond them would
make pip fail or list it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

import hvd_overlap

ROOT = Path(__file__).resolve().parents[1]
#: the user's stack: never a plain requirement of the package
STACK = {"tensorflow", "tensorflow-cpu", "tensorflow-gpu", "keras", "tf-keras", "numpy",
         "horovod"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The package's wheel, built from a copy of the tree (an in-tree build leaves build/ and
    *.egg-info behind)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", ".ruff_cache", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "--no-index", "-q", "-w", str(tmp)], check=True,
                   timeout=300, cwd=tmp)
    (built,) = tmp.glob("hvd_overlap-*.whl")
    return built


def _requires(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def _name(requirement: str) -> str:
    return re.split(r"[ ;<>=!~\[(]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _dry_run(tmp: Path, wheel: Path, installed: dict[str, str]) -> subprocess.CompletedProcess:
    """``pip install --dry-run --report`` of ``wheel`` into a new empty venv holding stand-ins
    (metadata only) of ``installed`` (name: version), offline."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True, timeout=60).stdout.strip())
    for name, ver in installed.items():
        info = site / f"{name.replace('-', '_')}-{ver}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n")
        (info / "RECORD").write_text("")
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run",
         "--no-index", "--disable-pip-version-check", "--report", str(tmp / "report.json"),
         str(wheel)], capture_output=True, text=True, timeout=300)


def test_one_version_number():
    """pyproject.toml reads the package's ``__version__``; the installed metadata agrees."""
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
    assert version("hvd-overlap") == hvd_overlap.__version__


def test_the_wheel_holds_the_runtime_and_no_lab(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"hvd_overlap-{hvd_overlap.__version__}-")
    assert "hvd_overlap/keras/optimizer.py" in names and "hvd_overlap/tools/cli.py" in names
    assert "hvd_overlap/tools/doctor.py" in names
    assert not [n for n in names if n.startswith(("benchmarks/", "examples/"))]
    # the lab's modules and this machine's measured profiles stay in the repository
    lab = ("netns", "hostrun", "calibrate", "worker", "launch", "results", "digits")
    assert not [n for n in names if Path(n).stem in lab], names
    assert not [n for n in names if n.endswith("-cpu.json") or "overheads" in n]


def test_the_plain_install_requires_nothing_of_the_users_stack(wheel):
    plain = [r for r in _requires(wheel) if "extra ==" not in r]
    assert {_name(r) for r in plain} == {"click"}, plain
    # the bare-environment extra brings a tested TensorFlow, on every supported Python
    cpu = [r for r in _requires(wheel) if 'extra == "cpu"' in r]
    assert {_name(r) for r in cpu} >= {"tensorflow-cpu", "tensorflow", "tf-keras"}, cpu
    assert not [r for r in _requires(wheel) if _name(r) == "numpy"], "numpy: TensorFlow pins it"


@pytest.mark.parametrize("stack", [
    {"tensorflow": "2.18.0", "keras": "3.6.0", "tf-keras": "2.18.0", "numpy": "2.0.2"},
    {"tensorflow-cpu": "2.15.1", "keras": "2.15.0", "numpy": "1.26.4"},
], ids=["tensorflow-2.18-numpy-2", "tensorflow-cpu-2.15"])
def test_installing_into_a_horovod_environment_installs_only_the_plugin(wheel, tmp_path, stack):
    """The issue's case: an environment with `tensorflow` (not tensorflow-cpu) and Horovod."""
    out = _dry_run(tmp_path, wheel, {**stack, "horovod": "0.28.1", "click": "8.1.7"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [i["metadata"]["name"] for i in report["install"]] == ["hvd-overlap"]


def test_the_dry_run_sees_a_missing_requirement(wheel, tmp_path):
    """The harness can fail: without click (the one requirement) offline pip cannot install."""
    out = _dry_run(tmp_path, wheel, {"tensorflow": "2.18.0", "horovod": "0.28.1"})
    assert out.returncode != 0 and "click" in out.stdout + out.stderr, out.stderr[-2000:]


def test_requires_python_names_the_tested_versions():
    text = (ROOT / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.10,<3.13"' in text
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert f"Programming Language :: Python :: {this}" in text
