"""What strategy="auto" would choose (the model half of issue 15): the fastest predicted
whole-state plan, never predicted slower than stock Horovod, over a grid and in the CLI."""

import json

import pytest
from click.testing import CliRunner

from hvd_overlap.core import autoplan
from hvd_overlap.core.autoplan import choose, splits
from hvd_overlap.core.choice import (
    Deferred,
    Exchange,
    Hybrid,
    Layerwise,
    Sharded,
    StockHorovod,
)
from hvd_overlap.core.simulate import Cluster, Layer, Profile, load_profile, simulate
from hvd_overlap.tools.cli import main
from hvd_overlap.tools.simulate_report import cluster_from_options

MIB = 2**20
# six 8 MiB layers; 1 GiB/s: an 8 MiB allreduce at P=2 takes ~8 ms, each layer computes 3+6 ms
SIX = Profile("six", 32, tuple(Layer(f"l{i}", 0.003, 0.006, 8 * MIB, tensors=2)
                               for i in range(6)))


def test_splits_defer_a_quarter_half_three_quarters_of_the_bytes():
    assert splits([1] * 8) == [2, 4, 6]
    assert splits([10, 1]) == [1]           # never all, at least one
    assert splits([5]) == []                # one bucket: nothing to split


def test_candidates_cover_every_whole_state_strategy_and_no_sharded_one():
    cands = autoplan.candidates(SIX, bucket_sizes=(8 * MIB, 64 * MIB))
    names = {c.name for c in cands}
    assert names == {"horovod", "layerwise", "hybrid", "deferred"}
    assert cands.count(StockHorovod()) == 1
    assert Hybrid(bucket_bytes=8 * MIB, defer=3) in cands   # half of six buckets
    assert len(cands) == len(set(cands))
    assert Hybrid(bucket_bytes=8 * MIB, defer=3).factory_keywords() == {
        "strategy": "hybrid", "bucket_bytes": 8 * MIB, "defer": 3}


def test_choice_is_the_fastest_candidate_and_never_slower_than_stock():
    cl = Cluster(ranks=8, bandwidth=1e9, latency=20e-6, negotiation_s=5e-4, tensor_s=1e-4)
    ch = choose(SIX, cl)
    steps = [r.step_s for _, r in ch.ranking]
    assert steps == sorted(steps) and ch.result.step_s == steps[0] and ch.speedup > 1.001
    assert ch.stock.step_s == pytest.approx(simulate(SIX, "horovod", cl).step_s)
    assert ch.speedup >= 1.0
    best = autoplan.predict(SIX, cl, ch.best)
    assert best.step_s == pytest.approx(ch.result.step_s)
    assert "vs stock" in ch.reason()


def test_a_tie_keeps_stock():
    # one layer, nothing to overlap: every plan sends the same single collective
    one = Profile("one", 1, (Layer("a", 0.001, 0.002, MIB, tensors=1),))
    ch = choose(one, Cluster(ranks=2, bandwidth=1e9, cycle_s=0.0),
                [Layerwise(bucket_bytes=MIB), StockHorovod()])
    assert ch.best == StockHorovod() and ch.speedup == pytest.approx(1.0)


def test_grid_over_shipped_profiles_never_below_stock():
    points = autoplan.grid({"vgg16": load_profile("vgg16")}, [2, 64, 512], ["1gbit", "25gbit"],
                           ["10us"], cluster_from_options)
    assert len(points) == 6
    for pt in points:  # the pick is the fastest of the ranking, stock's own path included
        fastest = min(r.step_s for _, r in pt.choice.ranking)
        assert pt.choice.result.step_s == pytest.approx(fastest)
        assert any(c == StockHorovod() for c, _ in pt.choice.ranking)
    # where the model predicts a win auto takes it: a plan other than stock's, >5% faster
    wins = [pt for pt in points if pt.choice.best.name != "horovod"]
    assert wins and max(pt.choice.speedup for pt in wins) > 1.05
    table = autoplan.grid_markdown(points)
    assert table.splitlines()[2].startswith("| vgg16 | 6 | ")


def test_simulate_command_shows_what_auto_chooses(tmp_path):
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(main, ["simulate", "vgg16", "--np", "8", "--bandwidth", "10gbit",
                                       "--strategies", "horovod,auto", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "auto at 8 ranks:" in result.output
    data = json.loads(out.read_text())["profiles"]["vgg16"]
    rows = {r["strategy"]: r for r in data["results"]}
    assert rows["auto"]["step_s"] <= rows["horovod"]["step_s"]
    assert data["auto"][0]["ranks"] == 8 and data["auto"][0]["speedup_vs_stock"] >= 1.0


def test_auto_grid_command(tmp_path):
    from benchmarks.cli import main as lab

    md = tmp_path / "grid.md"
    result = CliRunner().invoke(lab, ["auto-grid", "vgg16", "--np", "2,8", "--bandwidth",
                                       "10gbit", "--latency", "10us", "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    assert md.read_text() == result.output.rstrip("\n") + "\n"
    assert "| vgg16 | 2 |" in md.read_text()


def test_sharded_family_picks_the_fastest_sharded_plan_even_when_stock_is_faster():
    cl = Cluster(ranks=8, bandwidth=1e9, latency=20e-6, negotiation_s=5e-4, tensor_s=1e-4)
    ch = choose(SIX, cl, family="sharded")
    assert ch.best.name in ("sharded", "sharded_hybrid")
    assert all(c.name in ("sharded", "sharded_hybrid") for c, _ in ch.ranking)
    assert ch.result.step_s == min(r.step_s for _, r in ch.ranking)
    assert ch.stock.step_s == pytest.approx(simulate(SIX, "horovod", cl).step_s)
    slow = Cluster(ranks=8, bandwidth=1e9, reduce_scatter_bandwidth=1e7)  # sharding loses
    assert choose(SIX, slow, family="sharded").speedup < 1.0
    assert choose(SIX, slow).speedup >= 1.0
    with pytest.raises(ValueError, match="family"):
        choose(SIX, cl, family="nope")


def test_simulate_shows_auto_sharded(tmp_path):
    result = CliRunner().invoke(main, ["simulate", "vgg16", "--np", "8", "--bandwidth", "10gbit",
                                       "--strategies", "horovod,auto,auto_sharded"])
    assert result.exit_code == 0, result.output
    assert "auto at 8 ranks:" in result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("auto_sharded at 8"))
    assert "sharded" in line.split(":", 1)[1]


def test_simulated_auto_chooses_among_every_plan_as_the_runtime_does(tmp_path):
    """`simulate --strategies auto` is strategy="auto": on a GPU-fast VGG-16 over 10 GbE only
    the exchange wins big, and auto takes it; `auto_whole` stays among whole-state plans."""
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(main, ["simulate", "vgg16-h200", "--np", "8", "--bandwidth",
                                       "10gbit", "--latency", "50us", "--strategies",
                                       "horovod,auto,auto_whole", "--json", str(out)])
    assert result.exit_code == 0, result.output
    picks = {a["as"]: a for a in json.loads(out.read_text())["profiles"]["vgg16-h200"]["auto"]}
    assert picks["auto"]["exchange"] == "auto" and picks["auto"]["speedup_vs_stock"] > 3
    assert picks["auto_whole"]["strategy"] in autoplan.WHOLE_STATE
    assert picks["auto_whole"]["speedup_vs_stock"] < 1.1
    # where nothing beats stock by the margin (a link too fast to matter), auto keeps stock
    fast = Cluster(ranks=8, bandwidth=1e15, latency=0.0)
    assert choose(SIX, fast, family="every").best == StockHorovod()


# --- the run-time half: a profile of the real variables, fitted to a measured step -------------

def _specs():
    from hvd_overlap.core.plan import VarSpec

    shapes = [("conv", (3, 3, 8, 16)), ("conv", (16,)), ("fc1", (1024, 256)), ("fc1", (256,)),
              ("fc2", (256, 10)), ("fc2", (10,))]
    return [VarSpec(i, f"{layer}/v{i}:0", shape, "float32", layer)
            for i, (layer, shape) in enumerate(shapes)]


def test_profile_from_specs_has_one_layer_per_layer_with_exact_bytes():
    prof = autoplan.profile_from_specs(_specs(), {"conv": 5e6})
    assert [la.name for la in prof.layers] == ["conv", "fc1", "fc2"]
    assert [la.grad_bytes for la in prof.layers] == [(3 * 3 * 8 * 16 + 16) * 4,
                                                     (1024 * 256 + 256) * 4, (256 * 10 + 10) * 4]
    conv, fc1, _ = prof.layers
    assert conv.forward_s == 5e6 and conv.backward_s == 5e6  # first layer: no input gradient
    assert fc1.forward_s == 2 * (1024 * 256 + 256) and fc1.backward_s == 2 * fc1.forward_s


def test_fit_compute_reproduces_the_measured_step():
    prof = autoplan.profile_from_specs(_specs())
    cl = Cluster(ranks=4, bandwidth=1e8, negotiation_s=1e-3)
    stock = StockHorovod()
    for measured in (0.02, 0.2):
        fitted = autoplan.fit_compute(prof, cl, stock, measured)
        # the simulated step moves in Horovod cycles: within one cycle and its negotiation
        assert autoplan.predict(fitted, cl, stock).step_s == pytest.approx(
            measured, abs=cl.cycle_s + cl.negotiation_s)
        assert fitted.compute_s < measured
    # a measured step shorter than the predicted communication alone: compute ~ 0
    tiny = autoplan.fit_compute(prof, cl, stock, 1e-6)
    assert tiny.compute_s < 1e-5


def test_trial_order_takes_the_best_then_another_strategy_and_skips_the_probe():
    stock, r = StockHorovod(), simulate(SIX, "horovod", Cluster(ranks=2, bandwidth=1e9))
    ranked = [(Hybrid(bucket_bytes=MIB, defer=2), r), (Hybrid(bucket_bytes=4 * MIB, defer=2), r),
              (stock, r), (Layerwise(bucket_bytes=MIB), r), (Deferred(bucket_bytes=MIB), r)]
    assert autoplan.trial_order(ranked, stock) == [Hybrid(bucket_bytes=MIB, defer=2),
                                                   Layerwise(bucket_bytes=MIB)]
    assert autoplan.trial_order(ranked, Hybrid(bucket_bytes=MIB, defer=2), trials=1) == [
        Hybrid(bucket_bytes=4 * MIB, defer=2)]


def test_pick_keeps_the_preferred_plan_within_the_margin():
    stock, hyb = StockHorovod(), Hybrid(bucket_bytes=MIB, defer=2)
    assert autoplan.pick({stock: 1.0, hyb: 0.995}, stock) == stock   # within noise
    assert autoplan.pick({stock: 1.0, hyb: 0.95}, stock) == hyb
    assert autoplan.pick({stock: 1.0, hyb: 1.2}, stock) == stock


def test_a_dense_kernel_seen_with_its_batch_prices_the_exchange_candidates():
    """With the batch each dense kernel saw, the profile has dense layers and the candidates
    include the sharded plans with the exchange (each way of the forward), which the
    simulator predicts faster than stock's where a 1024x256 kernel at batch 8 makes the wire
    most of stock's step; without it, none."""
    specs = _specs()
    plain = autoplan.profile_from_specs(specs)
    assert not any(la.dense for la in plain.layers)
    assert not any(c.exchanges for c in autoplan.candidates(
        plain, strategies=autoplan.FAMILIES["every"], exchange=True))
    seen = autoplan.profile_from_specs(specs, dense={"fc1/v2:0": 8})
    assert seen.batch_size == 8
    assert [la.dense for la in seen.layers] == [None, (1024, 256), None]
    cands = autoplan.candidates(seen, bucket_sizes=(MIB,),
                                strategies=autoplan.FAMILIES["every"], exchange=True)
    ways = {c.exchange and c.exchange.forward for c in cands if c.name in autoplan.SHARDED}
    assert ways == {None, "rows", "gather"}
    assert not any(c.exchanges for c in cands if c.name not in autoplan.SHARDED)
    x = Sharded(bucket_bytes=MIB, exchange=Exchange(forward="rows"))
    assert x.spec() == "sharded+exchange+rows+bucket=1M" and x.kind == "sharded+exchange"
    assert x.factory_keywords() == {"strategy": "sharded", "bucket_bytes": MIB, "exchange": "auto",
                            "exchange_forward": "rows"}
    # and sharded with only the dense kernels sharded, each way (not sharded_hybrid: with the
    # rest allreduced in backprop, its split would only move the kernels' gathers)
    dense = {(c.name, c.exchange.forward) for c in cands
             if c.settings().get("shard") == "dense"}
    assert dense == {("sharded", "rows"), ("sharded", "gather")}
    d = Sharded(bucket_bytes=MIB, exchange=Exchange(forward="rows"), shard="dense")
    assert d.spec() == "sharded+exchange+rows+shard=dense+bucket=1M"
    assert d.kind == "sharded+exchange+shard=dense" != x.kind  # a trial of its own
    assert d.factory_keywords() == {**x.factory_keywords(), "shard": "dense"}
    assert "only the dense kernels sharded" in d.describe()
    slow = Cluster(ranks=2, bandwidth=1e6)  # stock's wire: 1.06 s of a 1.2 s step
    fitted = autoplan.fit_compute(seen, slow, StockHorovod(), 1.2)
    gather = Sharded(bucket_bytes=MIB, exchange=Exchange(forward="gather"))
    assert autoplan.predict(fitted, slow, gather).step_s < \
        0.7 * autoplan.predict(fitted, slow, StockHorovod()).step_s


def test_trial_order_tells_a_sharded_plan_from_the_same_with_the_exchange():
    r = simulate(SIX, "horovod", Cluster(ranks=2, bandwidth=1e9))
    x = Sharded(bucket_bytes=MIB, exchange=Exchange(forward="rows"))
    s = Sharded(bucket_bytes=4 * MIB)
    ranked = [(x, r), (Sharded(bucket_bytes=MIB, exchange=Exchange(forward="gather")), r), (s, r)]
    assert autoplan.trial_order(ranked, StockHorovod()) == [x, s]


def test_at_batch_scales_compute_and_the_exchange_s_batch_not_the_bytes():
    grown = autoplan.at_batch(SIX.scaled(1.0), 4)
    assert grown.batch_size == 128 and grown.grad_bytes == SIX.grad_bytes
    assert grown.compute_s == pytest.approx(4 * SIX.compute_s)
    # a bigger batch: more compute to hide the same wire under, never a slower stock step
    cluster = Cluster(ranks=2, bandwidth=2**30)
    assert autoplan.predict(grown, cluster, StockHorovod()).step_s > \
        autoplan.predict(SIX, cluster, StockHorovod()).step_s
