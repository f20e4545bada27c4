"""What the wheel holds, and the one version number."""

import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import version
from pathlib import Path

import hvd_overlap

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_number():
    """pyproject.toml reads the package's ``__version__``; the installed metadata agrees."""
    assert 'dynamic = ["version"]' in (ROOT / "pyproject.toml").read_text()
    assert version("hvd-overlap") == hvd_overlap.__version__


def test_the_wheel_holds_the_runtime_and_no_lab(tmp_path):
    # built from a copy: an in-tree build leaves build/ and *.egg-info behind
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", ".ruff_cache", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True, timeout=300,
                   cwd=tmp_path)
    (wheel,) = tmp_path.glob("hvd_overlap-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert wheel.name.startswith(f"hvd_overlap-{hvd_overlap.__version__}-")
    assert "hvd_overlap/keras/optimizer.py" in names and "hvd_overlap/tools/cli.py" in names
    assert not [n for n in names if n.startswith("benchmarks/")]
    # the lab's modules and this machine's measured profiles stay in the repository
    lab = ("netns", "hostrun", "calibrate", "worker", "launch", "results")
    assert not [n for n in names if Path(n).stem in lab], names
    assert not [n for n in names if n.endswith("-cpu.json") or "overheads" in n]
