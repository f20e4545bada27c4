"""The plan ``strategy="auto"`` would choose: every candidate the simulator can predict, fastest
first. The run-time half (``hvd_overlap.keras.executors.auto``) builds a profile of the real
model here (``profile_from_specs``, its compute scaled to the compute timed in the probe's
steps, or fitted to a measured step by ``fit_compute`` where none was timed),
ranks the candidates, and measures the first ones (``trial_order``) before keeping the fastest
(``pick``).

Family ``every`` (``strategy="auto"`` with an optimizer that can be sharded): every plan below,
the sharded ones also with the dense factor exchange (``sharded`` with it also sharding only the
dense kernels, the other buckets allreduced whole). Family ``whole`` (``strategy="auto"``
where sharding cannot run): plans that keep the optimizer state whole -- stock Horovod's own
fusion (``horovod``), ``layerwise``, ``hybrid`` and ``deferred``, each at several bucket sizes,
``hybrid`` at several split points. In both, stock's path is always a candidate, so the
predicted step of the choice is never longer than stock's; the margin says by how much it is
shorter. Family ``sharded`` (``strategy="sharded", bucket_bytes="auto"``: the user asked for
sharding): ``sharded`` and ``sharded_hybrid`` at those sizes and splits, the fastest kept even if
slower than stock, which is then only the reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hvd_overlap.core.choice import Exchange, StockHorovod, get
from hvd_overlap.core.margin import keep_unless_faster
from hvd_overlap.core.plan import VarSpec, build_layerwise_plan, input_side_share
from hvd_overlap.core.plan_builders import SHARD_DENSE
from hvd_overlap.core.simulate import Cluster, Layer, Profile, StepResult, _specs, simulate
from hvd_overlap.core.strategy import Strategy
from hvd_overlap.core.trial import MARGIN

MIB = 2**20
#: bucket byte budgets tried for the plan-based candidates
BUCKET_SIZES = (1 * MIB, 4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB)
WHOLE_STATE = ("horovod", "layerwise", "hybrid", "deferred")
SHARDED = ("sharded", "sharded_hybrid")
#: how an exchanged kernel's forward gets its weights, in the exchange candidates of ``every``
EXCHANGE_FORWARDS = ("rows", "gather")
FAMILIES = {"whole": WHOLE_STATE, "sharded": SHARDED, "every": WHOLE_STATE + SHARDED}
_SPLIT = ("hybrid", "sharded_hybrid")  # strategies whose split point is a choice
#: shares of the gradient bytes ``hybrid`` candidates defer into the next forward
SPLITS = (0.25, 0.5, 0.75)


@dataclass(frozen=True)
class Choice:
    """The fastest candidate, stock's prediction, and every candidate ranked."""

    best: Strategy
    result: StepResult
    stock: StepResult
    ranking: tuple[tuple[Strategy, StepResult], ...]

    @property
    def speedup(self) -> float:
        """Predicted stock step / chosen step (>= 1 but for the ``sharded`` family)."""
        return self.stock.step_s / self.result.step_s

    def reason(self) -> str:
        return (f"{self.best.describe()}: predicted efficiency {self.result.efficiency:.2f} vs "
                f"stock {self.stock.efficiency:.2f} ({self.speedup:.2f}x)")


def splits(nbytes: Sequence[int], fractions: Sequence[float] = SPLITS) -> list[int]:
    """Hybrid split points: for each fraction, how many input-side buckets hold at most that
    share of the bytes (``core.plan.input_side_share``). ``nbytes``: per bucket, backward
    order."""
    return sorted(set(d for d in (input_side_share(nbytes, f) for f in fractions) if d > 0))


def candidates(profile: Profile, bucket_sizes: Sequence[int] = BUCKET_SIZES,
               strategies: Iterable[str] = WHOLE_STATE, exchange: bool = False
               ) -> list[Strategy]:
    """Every candidate for this profile: ``hybrid`` / ``sharded_hybrid`` at each bucket size
    and split (a quarter, half, three quarters of the bytes deferred), the others at each
    bucket size; ``exchange``: the sharded ones also with the dense factor exchange (each way
    of ``EXCHANGE_FORWARDS``), where the profile has a dense layer, and ``sharded`` with it
    sharding only the dense kernels (``shard="dense"``)."""
    ways: tuple[str | None, ...] = (None,)
    if exchange and any(la.dense for la in profile.layers):
        ways += EXCHANGE_FORWARDS
    out: list[Strategy] = []
    for name in strategies:
        cls = get(name)
        if name == "horovod":
            out.append(cls())
            continue
        for way in ways if name in SHARDED else (None,):
            specs = _specs(profile, exchange=way is not None)
            ex = {} if way is None else {"exchange": Exchange(forward=way)}
            for size in bucket_sizes:
                if name not in _SPLIT:
                    out.append(cls(bucket_bytes=size, **ex))
                    if way is not None:  # and only its dense kernels sharded
                        out.append(cls(bucket_bytes=size, shard=SHARD_DENSE, **ex))
                    continue
                nbytes = [b.nbytes for b in build_layerwise_plan(specs, size).buckets] \
                    if specs else []
                out.extend(cls(bucket_bytes=size, defer=d, **ex) for d in splits(nbytes))
    return list(dict.fromkeys(out))


def predict(profile: Profile, cluster: Cluster, candidate: Strategy) -> StepResult:
    """The simulator's step for one candidate (its own plan: its bucket size and split)."""
    return simulate(profile, candidate, cluster)


#: a plan other than stock's is chosen only if predicted faster by more than this share
MIN_GAIN = 1e-3


def rank(profile: Profile, cluster: Cluster, pool: Iterable[Strategy]
         ) -> list[tuple[Strategy, StepResult]]:
    """Every candidate of ``pool`` with its predicted step, shortest first."""
    return sorted(((c, predict(profile, cluster, c)) for c in dict.fromkeys(pool)),
                  key=lambda cr: cr[1].step_s)


def choose(profile: Profile, cluster: Cluster, options: Sequence[Strategy] | None = None,
           family: str = "whole") -> Choice:
    """The candidate with the shortest predicted step. ``whole`` and ``every``: stock's path
    unless another one is predicted faster by more than ``MIN_GAIN`` (ties and rounding keep
    stock); ``sharded``: the fastest sharded candidate (stock is the reference only)."""
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: choose {' or '.join(FAMILIES)}")
    stock_c: Strategy = StockHorovod()
    keeps_stock = family != "sharded"
    pool = list(options if options is not None else candidates(
        profile, strategies=FAMILIES[family], exchange=family == "every"))
    pool = [c for c in pool if c != stock_c] + ([stock_c] if keeps_stock else [])
    ranked = rank(profile, cluster, pool)
    if not ranked:
        raise ValueError("no candidate to choose from")
    stock = predict(profile, cluster, stock_c)
    best, result = ranked[0]
    if keeps_stock and keep_unless_faster(result.step_s, stock.step_s, MIN_GAIN):
        best, result = stock_c, stock
    return Choice(best, result, stock, tuple(ranked))


# --- the run-time choice: a profile of the real model, fitted to a measured step ----------------

def profile_from_specs(specs: Sequence[VarSpec], flops: dict[str, float] | None = None,
                       name: str = "model", dense: dict[str, int] | None = None) -> Profile:
    """One profile layer per layer of the plan's variables, in forward order, with its exact
    gradient bytes. Compute in arbitrary units (``fit_compute`` scales them): the layer's
    forward FLOPs at batch 1 from ``flops`` (by layer name) or, for a layer it lacks, 2 per
    parameter (a dense layer's count); backward twice the forward, once for the first layer
    (no input gradient). ``dense``: the batch (rows per step) of each 2-D kernel the factor
    exchange could carry, by variable name; the profile's batch is their largest."""
    layers: dict[str, list[VarSpec]] = {}
    for v in sorted(specs, key=lambda v: v.index):
        layers.setdefault(v.layer, []).append(v)
    dense = dense or {}
    out: list[Layer] = []
    for k, (layer, vs) in enumerate(layers.items()):
        work = (flops or {}).get(layer) or 2.0 * sum(v.size for v in vs)
        sent = [v for v in vs if v.has_grad and not v.sparse]
        kernel = next((v.shape for v in sent if v.name in dense and len(v.shape) == 2), None)
        out.append(Layer(layer, work, work * (1.0 if k == 0 else 2.0),
                         sum(v.nbytes for v in sent), vs[0].dtype, len(sent), work,
                         dense=kernel))
    return Profile(name, max(dense.values(), default=1), tuple(out),
                   meta={"source": "run time: variables and FLOPs"})


def at_batch(profile: Profile, factor: float) -> Profile:
    """``profile`` at ``factor`` times its per-rank batch: every layer's compute and the batch
    the exchange is priced at scale with it; the optimizer update and the gradients do not."""
    return replace(profile, batch_size=max(1, round(profile.batch_size * factor)),
                   layers=tuple(replace(la, forward_s=la.forward_s * factor,
                                        backward_s=la.backward_s * factor)
                                for la in profile.layers))


def fit_compute(profile: Profile, cluster: Cluster, candidate: Strategy,
                measured_s: float) -> Profile:
    """``profile`` with its compute scaled so that the simulator's step of ``candidate`` on
    ``cluster`` equals ``measured_s`` (bisection: the step grows with the compute). If the
    communication alone is predicted longer than the measured step, the compute is
    negligible."""
    unit = profile.compute_s
    if unit <= 0 or measured_s <= 0:
        raise ValueError("fit_compute needs a profile with compute and a measured step > 0")

    def step(scale: float) -> float:
        return predict(profile.scaled(scale), cluster, candidate).step_s

    lo, hi = 0.0, measured_s / unit  # at hi the compute alone takes the measured step
    if step(hi * 1e-6) >= measured_s:
        return profile.scaled(hi * 1e-6)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if step(mid) < measured_s else (lo, mid)
    return profile.scaled(hi)


def trial_order(ranked: Sequence[tuple[Strategy, StepResult]], first: Strategy,
                trials: int = 2) -> list[Strategy]:
    """What the online check measures after ``first``: the predicted fastest other
    candidate, then the fastest of each further strategy, ``trials`` in all."""
    out: list[Strategy] = []
    for c, _ in ranked:
        if len(out) == trials:
            break
        if c != first and all(c.kind != o.kind for o in out):
            out.append(c)
    return out


def pick(measured: dict[Strategy, float], prefer: Strategy,
         margin: float = MARGIN) -> Strategy:
    """The fastest measured candidate; ``prefer`` (stock, or the user's own setting) unless
    another is faster by more than ``margin`` (timing noise must not move the plan; the one
    margin, ``core.trial.MARGIN``, that the exchange's online check uses too)."""
    best = min(measured, key=lambda c: measured[c])
    if prefer in measured and keep_unless_faster(measured[best], measured[prefer], margin):
        return prefer
    return best


def sweep(profile: Profile, cluster: Cluster, ranks: Sequence[int],
          family: str = "whole") -> list[Choice]:
    """``choose`` at every rank count."""
    return [choose(profile, replace(cluster, ranks=p), family=family) for p in ranks]


@dataclass(frozen=True)
class GridPoint:
    """One cluster of a grid and what auto chose there."""

    model: str
    ranks: int
    bandwidth: str
    latency: str
    choice: Choice


def grid(profiles: dict[str, Profile], ranks: Sequence[int], bandwidths: Sequence[str],
         latencies: Sequence[str], make_cluster, family: str = "whole") -> list[GridPoint]:
    """Auto's choice at every (profile, ranks, bandwidth, latency);
    ``make_cluster(ranks, bandwidth, latency)`` builds the cluster."""
    return [GridPoint(name, p, bw, lat, choose(prof, make_cluster(p, bw, lat), family=family))
            for name, prof in profiles.items() for bw in bandwidths for lat in latencies
            for p in ranks]


def grid_markdown(points: Sequence[GridPoint]) -> str:
    """Per model: auto's predicted speedup over stock (min / median / max), how often it keeps
    stock's path, and the strategies it picks."""
    import numpy as np

    lines = ["| model | clusters | auto / stock: min | median | max | keeps stock | picks |",
             "|---|---|---|---|---|---|---|"]
    for model in dict.fromkeys(pt.model for pt in points):
        mine = [pt for pt in points if pt.model == model]
        speed = np.array([pt.choice.speedup for pt in mine])
        picks: dict[str, int] = {}
        for pt in mine:
            picks[pt.choice.best.name] = picks.get(pt.choice.best.name, 0) + 1
        stock = picks.get("horovod", 0)
        lines.append(f"| {model} | {len(mine)} | {speed.min():.3f}x | {np.median(speed):.3f}x "
                     f"| {speed.max():.2f}x | {stock} of {len(mine)} | "
                     + ", ".join(f"{k} {v}" for k, v in sorted(picks.items(),
                                                                key=lambda kv: -kv[1])) + " |")
    return "\n".join(lines) + "\n"
