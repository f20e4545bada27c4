"""The profile format: a model's per-layer compute seconds and gradient bytes, as JSON
(``hvd-overlap profile`` writes it; ``hvd_overlap/core/profiles`` ships some)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from hvd_overlap.core.plan import itemsize

PROFILE_FORMAT = "hvd-overlap-profile/1"
SHIPPED = Path(__file__).parent.parent / "profiles"


@dataclass(frozen=True)
class Layer:
    """One layer in forward order: seconds forward and backward, and its gradient."""

    name: str
    forward_s: float
    backward_s: float
    grad_bytes: int = 0
    dtype: str = "float32"
    tensors: int = 0
    flops: float | None = None  # forward FLOPs (FLOPs-derived profiles)
    #: a dense layer's kernel shape ``(n_in, n_out)`` (its ``grad_bytes`` hold that kernel and
    #: any bias): the factor exchange can carry the kernel
    dense: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.dense is not None:
            n_in, n_out = (int(d) for d in self.dense)
            object.__setattr__(self, "dense", (n_in, n_out))
            if min(n_in, n_out) < 1 or n_in * n_out * itemsize(self.dtype) > self.grad_bytes:
                raise ValueError(f"layer {self.name!r}: a dense kernel of {n_in}x{n_out} "
                                 f"{self.dtype} does not fit in its {self.grad_bytes} bytes")

    @property
    def kernel_bytes(self) -> int:
        """Bytes of the dense kernel (0: not a dense layer)."""
        return self.dense[0] * self.dense[1] * itemsize(self.dtype) if self.dense else 0

    def to_dict(self) -> dict[str, Any]:
        """The layer as profile JSON (``dense`` only if set: older readers keep working)."""
        d = asdict(self)
        if self.dense is None:
            del d["dense"]
        else:
            d["dense"] = list(self.dense)
        return d


@dataclass(frozen=True)
class Profile:
    """A model's per-layer compute and gradients, at one batch size per rank."""

    model: str
    batch_size: int
    layers: tuple[Layer, ...]
    update_s: float = 0.0  # optimizer update of every variable; split by gradient bytes
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def grad_bytes(self) -> int:
        return sum(la.grad_bytes for la in self.layers)

    @property
    def compute_s(self) -> float:
        """Seconds of one step without communication."""
        return sum(la.forward_s + la.backward_s for la in self.layers) + self.update_s

    def scaled(self, factor: float) -> Profile:
        """Every compute time multiplied by ``factor`` (a faster or slower device)."""
        return replace(self, update_s=self.update_s * factor, layers=tuple(
            replace(la, forward_s=la.forward_s * factor, backward_s=la.backward_s * factor)
            for la in self.layers))

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT, "model": self.model, "batch_size": self.batch_size,
                "update_s": self.update_s, "grad_bytes": self.grad_bytes,
                "compute_s": self.compute_s, "meta": self.meta,
                "layers": [la.to_dict() for la in self.layers]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Profile:
        if d.get("format") != PROFILE_FORMAT:
            raise ValueError(f"not a profile written by `hvd-overlap profile` "
                             f"(format {d.get('format')!r}, expected {PROFILE_FORMAT!r})")
        return cls(model=d["model"], batch_size=int(d["batch_size"]),
                   update_s=float(d.get("update_s", 0.0)), meta=d.get("meta", {}),
                   layers=tuple(Layer(**la) for la in d["layers"]))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")


def shipped_profiles() -> list[str]:
    """Names of the profiles that ship with the package (``hvd_overlap/core/profiles``)."""
    return sorted(p.stem for p in SHIPPED.glob("*.json") if not p.stem.startswith("overheads"))


def load_profile(name: str | Path) -> Profile:
    """A profile from a JSON file, or a shipped one by name (``resnet50``)."""
    path = Path(name)
    if not path.exists():
        path = SHIPPED / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"profile {str(name)!r}: no such file, and not a shipped "
                                f"profile ({', '.join(shipped_profiles())})")
    return Profile.from_dict(json.loads(path.read_text()))
