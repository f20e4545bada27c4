"""The step-time simulator: ring costs, overlap, cycles and fusion, CPU steal, P scaling, the
shipped profiles, FLOPs counting, and the `profile` / `simulate` commands."""

import json
from dataclasses import replace

import pytest
import tensorflow as tf
from click.testing import CliRunner

from benchmarks.cli import main as lab
from benchmarks.validation import lab_profile, validation_markdown
from hvd_overlap.core.exchange import DenseShape
from hvd_overlap.core.plan import EXCHANGE, FORWARD, VarSpec, build_layerwise_plan
from hvd_overlap.core.simulate import (
    EXCHANGE_STRATEGIES,
    STRATEGIES,
    Cluster,
    Layer,
    Profile,
    buckets_of,
    build_step,
    exchange_choices,
    load_profile,
    plan_of,
    run_step,
    simulate,
)
from hvd_overlap.keras.flops import dense_kernel, layer_flops
from hvd_overlap.tools.cli import main
from hvd_overlap.tools.simulate_report import parse_duration, parse_ranks

# Two layers a -> b, 100 B of gradient each; 100 B/s: an allreduce of 100 B at P=2 takes 1 s.
TWO = Profile("two", 1, (Layer("a", 1.0, 2.0, 100, tensors=1),
                         Layer("b", 1.0, 2.0, 100, tensors=1)))


def cluster(**kw) -> Cluster:
    return Cluster(**{"ranks": 2, "bandwidth": 100.0, "cycle_s": 0.0, **kw})


def step(profile: Profile, strategy: str, **kw) -> float:
    return simulate(profile, strategy, cluster(**kw)).step_s


def test_ring_costs_by_hand():
    c = Cluster(ranks=4, bandwidth=100.0, latency=0.5)
    assert c.allreduce(100) == pytest.approx(2 * 3 / 4 * 1 + 2 * 3 * 0.5)   # 4.5
    assert c.reduce_scatter(100) == c.allgather(100) == pytest.approx(2.25)
    assert c.wire_bytes("allreduce", 100) == 150
    assert c.wire_bytes("reduce_scatter", 100) + c.wire_bytes("allgather", 100) == 150
    neg = {g: Cluster(8, 1.0, negotiation_s=0.1, negotiation_growth=g).negotiation()
           for g in ("log2", "linear", "none")}
    assert neg == pytest.approx({"log2": 0.3, "linear": 0.7, "none": 0.1})
    assert Cluster(1, 1.0, negotiation_s=0.1).negotiation() == 0
    # measured per collective type (Gloo's reduce-scatter / all-gather below the link's rate)
    gloo = Cluster(ranks=2, bandwidth=100.0, reduce_scatter_bandwidth=50.0,
                   allgather_bandwidth=25.0)
    assert gloo.allreduce(100) == pytest.approx(1.0)
    assert gloo.reduce_scatter(100) == pytest.approx(1.0)
    assert gloo.allgather(100) == pytest.approx(2.0)
    # alltoall of 100 B on each rank: keeps 1/4, sends 3/4 in 3 pairwise steps
    assert c.alltoall(100) == pytest.approx(3 / 4 + 3 * 0.5)
    assert c.wire_bytes("alltoall", 100) == 75
    assert Cluster(2, 100.0, alltoall_bandwidth=25.0).alltoall(100) == pytest.approx(2.0)


def test_one_bucket_after_compute():
    one = Profile("one", 1, (Layer("a", 1.0, 2.0, 100, tensors=1),))
    for s in STRATEGIES:  # nothing to overlap with: compute 3 s + one allreduce of 1 s
        assert step(one, s) == pytest.approx(4.0), s


def test_overlap_by_hand():
    # horovod: fwd 0-2; b's gradient at 4 -> sent 4-5 under a's backward; a's at 6 -> 6-7
    assert step(TWO, "horovod") == pytest.approx(7.0)
    # layerwise, one 200 B bucket (4 MiB budget): ready at 6, sent 6-8
    assert step(TWO, "layerwise") == pytest.approx(8.0)
    # deferred, one bucket: arrives at 2, forward 2-4, backward 4-8
    assert step(TWO, "deferred") == pytest.approx(8.0)
    # 100 B buckets: layerwise overlaps like horovod; deferred sends a 0-1, b 1-2, forward
    # a 1-2, b 2-3, backward 3-7; hybrid defers a (half the bytes) and sends b under a's bwd
    for s in ("layerwise", "deferred", "hybrid"):
        assert step(TWO, s, bucket_bytes=100) == pytest.approx(7.0), s
    # sharded: all-gathers 0-0.5 (a), 0.5-1 (b); forward 0.5-2.5; reduce-scatter of b 4.5-5,
    # of a 6.5-7 -> 7
    assert step(TWO, "sharded", bucket_bytes=100) == pytest.approx(7.0)


# Three layers a -> b -> c, 100 B each in 100 B buckets (backward order: c 0, b 1, a 2); at
# P=2 and 100 B/s a reduce-scatter or all-gather of a bucket takes 0.5 s. Forward 0.25 s,
# backward 1 s per layer; the update of a bucket 0.2 s, of its 1/P slice 0.1 s.
THREE = Profile("three", 1, tuple(Layer(n, 0.25, 1.0, 100, tensors=1) for n in "abc"),
                update_s=0.6)


def test_sharded_hybrid_by_hand():
    c = cluster(bucket_bytes=100)
    tasks, reqs = build_step(THREE, "sharded_hybrid", c)
    out = run_step(tasks, reqs, c)
    done = out["done"]
    # half the bytes: only a (bucket 2) waits for the next step: all-gathered 0-0.5, forward
    # a 0.5-0.75, b 0.75-1.0, c 1.0-1.25 without waiting. Backward c: its weights' part
    # 1.25-1.5, then reduce-scatter c 1.5-2.0 under its inputs' part; c's slice is updated at
    # once (2.0-2.1, the inputs' part paused), c's all-gather 2.1-2.6 while that part ends
    # (2.35) and b's weights' part runs (2.35-2.6); reduce-scatter b 2.6-3.1, update 3.1-3.2,
    # all-gather b 3.2-3.7 while b's inputs' part ends (3.45); backward a (the first layer: no
    # input gradient, one part) 3.45-4.45; reduce-scatter a 4.45-4.95, its update after
    # backprop 4.95-5.05.
    assert done == pytest.approx({"allgather bucket 2": 0.5, "reduce_scatter bucket 0": 2.0,
                                  "allgather bucket 0": 2.6, "reduce_scatter bucket 1": 3.1,
                                  "allgather bucket 1": 3.7, "reduce_scatter bucket 2": 4.95})
    assert out["end"] == pytest.approx(5.05)
    # output-side all-gathers finish in backprop (by 4.45), the input-side one in the forward
    assert done["allgather bucket 1"] <= 4.45 + 1e-9 and done["allgather bucket 2"] == 0.5
    # sharded: every all-gather chained at the start (0-0.5, 0.5-1, 1-1.5), forward a
    # 0.5-0.75, b 1-1.25, c 1.5-1.75; backward 1.75-4.75 (c's and b's weights' parts end at
    # 2.0 and 3.0); reduce-scatters 2.0-2.5, 3.0-3.5, 4.75-5.25; updates c, b 4.75-4.95, a
    # 5.25-5.35
    assert step(THREE, "sharded", bucket_bytes=100) == pytest.approx(5.35)
    # every bucket deferred: sharded_hybrid is sharded; no bucket deferred: all in backprop
    for defer in (3, 10, -1):
        assert simulate(THREE, "sharded_hybrid", c, defer=defer).step_s == pytest.approx(5.35)
    assert simulate(THREE, "sharded", c, defer=1).step_s == pytest.approx(5.05)
    # defer=0: forward 0-0.75 without waiting, backward 0.75-3.95 (0.2 s of updates inside;
    # c's and b's reduce-scatters and all-gathers under it), reduce-scatter a 3.95-4.45, update
    # 4.45-4.55, all-gather a 4.55-5.05
    r = simulate(THREE, "sharded_hybrid", c, defer=0)
    assert r.step_s == pytest.approx(5.05) and r.collectives == 6


def test_cycles_and_negotiation():
    # cycles every 0.5 s, 0.1 s negotiation: b's gradient ready after its weights' part, at 3.0
    # (a cycle starts then): 3.1-4.1; next cycles at 4.6, 5.1, 5.6, 6.1 -> a (ready at 6.0)
    # 6.2-7.2
    assert step(TWO, "horovod", cycle_s=0.5, negotiation_s=0.1) == pytest.approx(7.2)


# Four layers whose gradients all appear within one cycle: Horovod fuses them.
FOUR = Profile("four", 1, tuple(Layer(f"l{i}", 0.0, 0.1, 10, tensors=1) for i in range(4)))


def test_cycle_fusion():
    kw = {"bandwidth": 1000.0, "cycle_s": 1.0, "bucket_bytes": 10}
    r = simulate(FOUR, "horovod", cluster(**kw))
    assert (r.collectives, r.step_s) == (1, pytest.approx(1.04))  # one cycle at 1.0, one op
    r = simulate(FOUR, "horovod", cluster(fusion_bytes=20, **kw))
    assert (r.collectives, r.step_s) == (2, pytest.approx(1.04))  # threshold: two buffers
    r = simulate(FOUR, "layerwise", cluster(negotiation_s=0.05, **kw))
    assert (r.collectives, r.step_s) == (4, pytest.approx(1.09))  # one negotiation, 4 ops
    # deferred buckets are chained in forward order: each waits for the next cycle
    # (0, 1, 2, 3 s): the last arrives at 3.01 + 0.05, then the backward 0.4 s
    r = simulate(FOUR, "deferred", cluster(negotiation_s=0.05, **kw))
    assert r.step_s == pytest.approx(3.0 + 0.05 + 0.01 + 0.4)


def test_cpu_steal_and_comm_slowdown():
    # b's allreduce (3-4) overlaps b's inputs' part of the backward (3-4), then a's (4-6)
    assert step(TWO, "horovod", cpu_steal=0.5) == pytest.approx(7.5)      # bwd a 4.5-6.5
    assert step(TWO, "horovod", comm_slowdown=2.0) == pytest.approx(7.0)  # b's ends at 5
    # both: b's inputs' part and its allreduce at half speed, 3-5; a 5-7, its allreduce 7-8
    assert step(TWO, "horovod", cpu_steal=0.5, comm_slowdown=2.0) == pytest.approx(8.0)


def test_a_layers_gradient_travels_under_its_input_gradient():
    """A layer's backward computes its weight gradient first (the forward's FLOPs), then its
    input gradient: the gradient's collective is issued between the two. The first layer
    computes no input gradient."""
    tasks, reqs = build_step(TWO, "horovod", cluster())
    assert [t.label for t in tasks[:4]] == ["forward a", "forward b", "backward b weights",
                                            "backward b inputs"]
    assert tasks[2].work == 1.0 and tasks[3].work == 1.0 and tasks[4].label == "backward a"
    out = run_step(tasks, reqs, cluster())
    # forward 0-2; b's weights 2-3, its allreduce 3-4 under b's inputs (3-4); a 4-6, 6-7
    assert out["done"] == pytest.approx({"allreduce b": 4.0, "allreduce a": 7.0})


def test_sharded_sends_the_bytes_of_one_allreduce_and_updates_a_shard():
    prof = Profile("p", 1, TWO.layers, update_s=0.8)
    for p in (2, 8, 64):
        c = cluster(ranks=p, bucket_bytes=100)
        layerwise = simulate(prof, "layerwise", c)
        for s in ("sharded", "sharded_hybrid"):
            sharded = simulate(prof, s, c)
            assert sharded.wire_bytes == pytest.approx(layerwise.wire_bytes), s
            assert sharded.wire_bytes == pytest.approx(2 * (p - 1) / p * 200), s
    # with a free link the step is the compute, and sharded updates 1/P of the bytes
    fast = cluster(ranks=4, bandwidth=1e15)
    assert simulate(prof, "layerwise", fast).step_s == pytest.approx(6.8)
    assert simulate(prof, "sharded", fast).step_s == pytest.approx(6.2)
    assert simulate(prof, "sharded_hybrid", fast).step_s == pytest.approx(6.2)


def test_scaling_with_ranks():
    c = {"bandwidth": 100.0, "latency": 0.01}
    steps = [step(TWO, "layerwise", ranks=p, **c) for p in (2, 4, 64, 1024)]
    assert steps == sorted(steps)  # more ranks, more bytes per rank and more latency
    # one bucket of 200 B after all compute: 6 s + 2 (P-1)/P * 2 s + 2 (P-1) * 0.01
    assert steps[-1] == pytest.approx(6 + 2 * 1023 / 1024 * 2 + 2 * 1023 * 0.01)
    assert simulate(TWO, "horovod", cluster(ranks=1)).step_s == TWO.compute_s


def test_hybrid_default_matches_the_strategy():
    from hvd_overlap.core.plan import half_the_bytes

    sizes = [4000, 100, 2000, 50, 300]
    specs = [VarSpec(i, f"l{i}/k:0", (n,), "float32", f"l{i}") for i, n in enumerate(sizes)]
    prof = Profile("p", 1, tuple(Layer(f"l{i}", 0.1, 0.1, 4 * n, tensors=1)
                                 for i, n in enumerate(sizes)))
    for budget in (1, 10_000, 2**20):
        want = half_the_bytes([b.nbytes for b in build_layerwise_plan(specs, budget).buckets])
        for strategy in ("hybrid", "sharded_hybrid"):  # the simulator reads the runtime's plan
            late = [b for b in buckets_of(prof, plan=plan_of(prof, strategy, budget))
                    if b.phase == FORWARD]
            assert len(late) == want, (strategy, budget)


@pytest.mark.parametrize("name,total,trainable", [
    ("resnet50", 25_636_712, 25_583_592), ("vgg16", 138_357_544, 138_357_544),
    ("resnet101", 44_707_176, 44_601_832)])
def test_shipped_profiles_have_exact_bytes(name, total, trainable):
    prof = load_profile(name)
    assert prof.meta["total_params"] == total
    assert prof.grad_bytes == 4 * trainable
    assert prof.layers[0].backward_s == pytest.approx(prof.layers[0].forward_s)  # first layer
    r = simulate(prof, "horovod", Cluster(64, 25e9 / 8, 1e-5))
    assert 0 < r.efficiency <= 1


def test_layer_flops_by_hand():
    dense = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(4,))])
    assert layer_flops(dense.layers[0], 2) == 2 * 3 * (2 * 4 + 1)
    conv = tf.keras.Sequential([tf.keras.layers.Conv2D(2, 3, padding="same",
                                                       input_shape=(5, 5, 1))])
    assert layer_flops(conv.layers[0], 1) == 25 * 2 * (2 * 9 * 1 + 1)
    assert dense_kernel(dense.layers[0]) == (4, 3) and dense_kernel(conv.layers[0]) is None
    seq = tf.keras.Sequential([tf.keras.layers.Dense(3, input_shape=(5, 4))])  # on sequences
    assert dense_kernel(seq.layers[0]) is None


def test_parsers():
    assert parse_duration("10us") == pytest.approx(1e-5)
    assert parse_duration("0.5ms") == pytest.approx(5e-4)
    assert parse_ranks("2-16") == [2, 4, 8, 16]
    assert parse_ranks("3,64") == [3, 64]
    with pytest.raises(ValueError):
        parse_ranks("0")


def tiny_model() -> tf.keras.Model:
    """A small functional model with a branch (``tests.test_simulate:tiny_model``)."""
    inp = tf.keras.Input((8, 8, 3))
    x = tf.keras.layers.Conv2D(4, 3, padding="same")(inp)
    y = tf.keras.layers.Conv2D(4, 1)(x)
    x = tf.keras.layers.Add()([x, y])
    x = tf.keras.layers.GlobalAveragePooling2D()(x)
    return tf.keras.Model(inp, tf.keras.layers.Dense(2)(x))


def test_profile_command_measures_a_functional_model(tmp_path):
    out = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["profile", "tests.test_simulate:tiny_model",
                                    "--batch-size", "4", "--repeats", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    assert [la.tensors for la in prof.layers] == [2, 2, 0, 0, 2]
    assert [la.dense for la in prof.layers] == [None] * 4 + [(4, 2)]
    assert prof.grad_bytes == 4 * tiny_model().count_params()
    assert prof.meta["source"] == "measured" and prof.meta["step_s"] > 0


def test_simulate_command_json_and_plot(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    res = CliRunner().invoke(main, ["simulate", "resnet50", "--np", "2,512",
                                    "--bandwidth", "25gbit", "--latency", "10us",
                                    "--json", str(out), "--plot", str(png)])
    assert res.exit_code == 0, res.output
    results = json.loads(out.read_text())["profiles"]["resnet50"]["results"]
    assert {(r["ranks"], r["strategy"]) for r in results} == \
        {(p, s) for p in (2, 512) for s in (*STRATEGIES, "auto")}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = CliRunner().invoke(main, ["simulate", "no-such-profile"])
    assert bad.exit_code != 0 and "shipped" in bad.output
    bad = CliRunner().invoke(main, ["simulate", "resnet50", "--strategies", "sharded,nope"])
    assert bad.exit_code != 0 and "nope" in bad.output
    res = CliRunner().invoke(main, ["simulate", "vgg16", "--np", "64", "--defer", "-1",
                                    "--strategies", "sharded,sharded_hybrid", "--json", str(out)])
    assert res.exit_code == 0, res.output  # every bucket deferred: the same step
    a, b = json.loads(out.read_text())["profiles"]["vgg16"]["results"]
    assert a["step_s"] == pytest.approx(b["step_s"])


def test_validation_against_a_bench_run(tmp_path):
    local, hvd = 0.6, 0.7
    bench = {"raw": {"config": {"model": "vgg", "net": "plain", "batch_size": 64},
                     "ranks": 2, "step_times": {"local": [local], "horovod": [hvd]}},
             "strategies": {"horovod": {"step_time_s": hvd, "wire_s": 0.1},
                            "sharded_hybrid": {"step_time_s": hvd},
                            "future": {"step_time_s": hvd},
                            "local": {"step_time_s": local}}}
    path = tmp_path / "b.json"
    path.write_text(json.dumps(bench))
    table, checks = validation_markdown([path])
    by = {c.strategy: c for c in checks}
    assert by["horovod"].measured == hvd and by["horovod"].error is not None
    assert by["sharded"].measured is None and "not measured yet" in table
    assert by["sharded_hybrid"].measured == hvd and by["sharded_hybrid"].error is not None
    assert by["future"].predicted is None and by["future"].error is None
    assert "| vgg | plain | future | 700 | - | not modelled |" in table
    assert "local" not in by
    # communication costs something
    assert all(c.predicted > local for c in checks if c.predicted is not None)
    png, md = tmp_path / "v.png", tmp_path / "v.md"
    res = CliRunner().invoke(lab, ["validate", str(path), "--plot", str(png),
                                   "--markdown", str(md)])
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:4] == b"\x89PNG" and "| vgg | plain | horovod |" in md.read_text()
    assert md.read_text().endswith(f"--markdown {md} --plot {png}\n```\n")


def test_calibration_fit():
    from hvd_overlap.tools.collective_costs import GROUP, SIZES, fit

    def run(base: float) -> dict:
        return {"sizes": {str(n): {"wall_s": base + n / 1e9} for n in SIZES},
                "grouped": {"1": 1e-3, str(GROUP): 1e-3 + (GROUP - 1) * 1e-4},
                "steal": {"cpu_steal": 0.25, "comm_slowdown": 2.0}}

    f = fit(run(5e-4), run(1.1e-3))
    assert "reduce_scatter_bandwidth" not in f  # calibrations made before phases existed
    assert f["bandwidth"] == pytest.approx(1e9)
    assert f["overhead_s"] == pytest.approx(5e-4, rel=1e-3)
    assert f["cycle_period_s"] == pytest.approx(1.1e-3, rel=1e-3)
    assert f["tensor_s"] == pytest.approx(1e-4)
    assert (f["cpu_steal"], f["comm_slowdown"]) == (0.25, 2.0)


def test_calibration_fit_per_collective_type():
    from hvd_overlap.tools.collective_costs import GROUP, PHASE_SIZES, SIZES, fit

    def run(base: float) -> dict:
        return {"sizes": {str(n): {"wall_s": base + n / 1e9} for n in SIZES},
                "phases": {"reduce_scatter": {str(n): base + n / 5e8 for n in PHASE_SIZES},
                           "allgather": {str(n): base + n / 2.5e8 for n in PHASE_SIZES}},
                "grouped": {"1": 1e-3, str(GROUP): 1e-3}, "ranks": 2,
                "steal": {"cpu_steal": 0.0, "comm_slowdown": 1.0}}

    f = fit(run(5e-4), run(1.1e-3))
    # 2 ranks: each moves half of the n bytes, so the link rate is half of n / seconds
    assert f["reduce_scatter_bandwidth"] == pytest.approx(2.5e8)
    assert f["allgather_bandwidth"] == pytest.approx(1.25e8)
    from benchmarks.validation import measured_cluster

    c = measured_cluster("1gbit", 2, {"nets": {"1gbit hosts": {"fit": f}}}, "hosts")
    assert c.allgather(1e8) == pytest.approx(0.5 * 1e8 / 1.25e8)
    with pytest.raises(ValueError, match="--net-model loopback"):
        measured_cluster("1gbit", 2, {"nets": {"1gbit hosts": {"fit": f}}}, "loopback")


def test_calibration_fit_keeps_what_small_collectives_take_beyond_the_line():
    from hvd_overlap.tools.collective_costs import GROUP, PHASE_SIZES, SIZES, SMALL_SIZES, fit

    extra = {64 << 10: 4e-3, 256 << 10: 2e-3, 1 << 20: 0.0}

    def run(base: float, sizes=SIZES, phase_sizes=PHASE_SIZES) -> dict:
        def t(n: int, rate: float) -> float:
            return base + n / rate + extra.get(n, 0.0)
        return {"sizes": {str(n): {"wall_s": t(n, 1e9) if n > 4 else base} for n in sizes},
                "phases": {k: {str(n): t(n, 5e8) for n in phase_sizes}
                           for k in ("reduce_scatter", "allgather", "alltoall_gather")},
                "grouped": {"1": 1e-3, str(GROUP): 1e-3}, "ranks": 2,
                "steal": {"cpu_steal": 0.0, "comm_slowdown": 1.0}}

    f = fit(run(5e-4), run(5e-4))
    assert f["bandwidth"] == pytest.approx(1e9) and f["allgather_bandwidth"] == pytest.approx(2.5e8)
    assert set(f["small_excess_s"]) == {"allreduce", "reduce_scatter", "allgather",
                                        "alltoall_gather"}
    for by_size in f["small_excess_s"].values():
        assert by_size == pytest.approx({str(n): extra[n] for n in SMALL_SIZES}, abs=1e-9)
    # a calibration made before the small sizes were timed has none
    old = fit(run(5e-4, SIZES[:1] + SIZES[-3:], PHASE_SIZES[-3:]),
              run(5e-4, SIZES[:1] + SIZES[-3:], PHASE_SIZES[-3:]))
    assert "small_excess_s" not in old
    from benchmarks.validation import measured_cluster

    c = measured_cluster("1gbit", 2, {"nets": {"1gbit hosts": {"fit": f}}}, "hosts")
    assert c.alltoall(64 << 10) == pytest.approx(0.5 * (64 << 10) / 2.5e8 + 4e-3)
    assert c.allreduce(16 << 20) == pytest.approx((16 << 20) / 1e9)


def test_small_collectives_cost_what_was_measured_beyond_the_line():
    small = (("alltoall", ((64, 2.0), (256, 1.0))), ("allreduce", ((64, 0.5),)))
    c = Cluster(ranks=2, bandwidth=100.0, alltoall_bandwidth=50.0, small_excess=small)
    line = Cluster(ranks=2, bandwidth=100.0, alltoall_bandwidth=50.0)
    added = {n: c.alltoall(n) - line.alltoall(n) for n in (32, 64, 160, 256, 640, 1024, 4096)}
    # from 0 at no bytes, through the measured sizes, to 0 at 4 x the largest
    assert added == pytest.approx({32: 1.0, 64: 2.0, 160: 1.5, 256: 1.0, 640: 0.5, 1024: 0.0,
                                   4096: 0.0})
    # 0.5 at 64 B, 0 at 4 x 64 B
    assert c.allreduce(128) - line.allreduce(128) == pytest.approx(0.5 * 2 / 3)
    assert c.allgather(64) == line.allgather(64)  # a kind not measured adds nothing
    # once per ring step: P-1 of them
    four = replace(c, ranks=4)
    assert four.alltoall(64) - replace(line, ranks=4).alltoall(64) == pytest.approx(6.0)
    # the exchange's small dependent collectives pay it at each one; stock's one fused
    # allreduce of a large model pays nothing
    big = Profile("big", 16, (Layer("fc", 4.0, 8.0, 4 << 20, tensors=1,
                                    dense=(1024, 1024)),))
    fast = Cluster(ranks=2, bandwidth=1e9, cycle_s=0.0)
    slow = replace(fast, small_excess=(("alltoall", ((64 << 10, 0.5),)),
                                       ("allgather", ((64 << 10, 0.5),))))
    assert simulate(big, "horovod", slow).step_s == simulate(big, "horovod", fast).step_s
    assert (simulate(big, "sharded+exchange+rows", slow).step_s
            > simulate(big, "sharded+exchange+rows", fast).step_s + 0.5)


def test_validation_compares_stock_with_the_stock_model_and_skips_unprofiled_models(tmp_path):
    local, stock, exchange = 0.6, 0.7, 0.65
    bench = {"raw": {"config": {"model": "vgg", "net": "plain", "batch_size": 32},
                     "ranks": 2, "step_times": {"local": [local], "stock": [stock]}},
             "strategies": {"stock": {"step_time_s": stock}, "local": {"step_time_s": local},
                            "sharded+exchange+rows": {"step_time_s": exchange},
                            "alexnet_plan": {"step_time_s": 1.0}}}
    unprofiled = {**bench, "raw": {**bench["raw"], "config": {**bench["raw"]["config"],
                                                              "model": "alexnet"}}}
    paths = [tmp_path / "b.json", tmp_path / "c.json"]
    paths[0].write_text(json.dumps(bench))
    paths[1].write_text(json.dumps(unprofiled))
    table, checks = validation_markdown(paths)
    by = {c.strategy: c for c in checks}
    assert by["stock"].measured == stock and by["stock"].predicted is not None
    # every strategy the run measured: the exchange's predicted, one unknown not modelled
    assert by["sharded+exchange+rows"].measured == exchange
    assert by["sharded+exchange+rows"].predicted is not None
    assert by["alexnet_plan"].predicted is None
    assert "c.json`: not validated" in table and all(c.model == "vgg" for c in checks)


# --- the dense factor exchange (sharded+exchange: sharded with exchange="auto") ---------------

# x (no weights) -> fc, an 8x4 kernel without bias, batch 1: at P=2 the exchange sends
# 1/2*8 + 1*4 = 8 activation elements plus 16 of the rows' all-gather (24 < 32 for sharded).
FC = Profile("fc", 1, (Layer("x", 1.0, 1.0), Layer("fc", 1.0, 2.0, 4 * 32, tensors=1,
                                                 dense=(8, 4))))


def test_exchange_step_by_hand():
    c = cluster(bandwidth=8.0)  # P=2: 16 B of any collective's share take 1 s
    # sharded: all-gather of the 128 B kernel 0-8, forward x 0-1, fc 8-9, backward fc: its
    # weights' part 9-10, its inputs' 10-11, x 11-12; reduce-scatter 10-18
    assert simulate(FC, "sharded", c).step_s == pytest.approx(18.0)
    tasks, reqs = build_step(FC, "sharded+exchange", c)
    out = run_step(tasks, reqs, c)
    # exchange: as fc's backward starts (9) its input (alltoall of 32 B) 9-11 and output errors
    # (all-gather of 2 x 16 B) 11-13 travel; backward fc without its kernel GEMM (the forward's
    # 1 s) 9-10, x 10-11; the kernel's rows 13-14; no reduce-scatter
    assert out["done"] == pytest.approx({"allgather bucket 0": 8.0,
                                         "alltoall inputs bucket 0": 11.0,
                                         "allgather errors bucket 0": 13.0})
    assert out["end"] == pytest.approx(14.0)
    assert [r.kind for r in reqs] == ["allgather", "alltoall", "allgather"]


def test_only_the_dense_kernels_sharded_by_hand():
    """``shard="dense"``: x's weights are allreduced whole in backprop and updated on every
    rank (all of its update, eagerly); only fc's kernel is exchanged and gathered."""
    xfc = Profile("xfc", 1, (Layer("x", 1.0, 1.0, 32, tensors=1), FC.layers[1]), update_s=1.6)
    c = cluster(bandwidth=8.0)  # P=2: 16 B of any collective's share take 1 s
    tasks, reqs = build_step(xfc, "sharded+exchange+shard=dense", c)
    out = run_step(tasks, reqs, c)
    # all-gather of fc's 128 B kernel 0-8; forward x 0-1 (nothing to wait for), fc 8-9;
    # backward fc (no kernel GEMM) 9-10, x 10-11; inputs 9-11, errors 11-13, kernel rows
    # 13-14; x's allreduce of 32 B (twice a share) 13-17, then its update (32 of the 160 B'
    # 1.6 s, whole: 0.32 s) 17-17.32
    assert [r.kind for r in reqs] == ["allgather", "alltoall", "allgather", "allreduce"]
    assert out["done"] == pytest.approx({"allgather bucket 1": 8.0,
                                         "alltoall inputs bucket 1": 11.0,
                                         "allgather errors bucket 1": 13.0,
                                         "allreduce bucket 0": 17.0})
    assert out["end"] == pytest.approx(17.32)
    # every bucket sharded: x's slice all-gathered first at the step's start (0-2), fc's 2-10;
    # backward 11-13, inputs 11-13, errors 13-15, x reduce-scattered 15-17, its slice's
    # update (0.16 s) 17-17.16
    tasks, reqs = build_step(xfc, "sharded+exchange", c)
    assert [r.kind for r in reqs] == ["allgather", "allgather", "alltoall", "allgather",
                                      "reduce_scatter"]
    assert run_step(tasks, reqs, c)["end"] == pytest.approx(17.16)


def test_exchange_wire_bytes_are_the_shapes():
    shape = DenseShape(8, 4, batch=1)
    for p in (2, 4):  # it pays while 1 x (8 + 4 P) < 32
        c = cluster(ranks=p)
        assert shape.exchange_pays(p)
        r = simulate(FC, "sharded+exchange", c)
        assert r.wire_bytes == pytest.approx(shape.exchange_elements(p) * 4)
        assert simulate(FC, "sharded", c).wire_bytes == pytest.approx(
            shape.sharded_elements(p) * 4)
    # a bias of 4 floats is reduce-scattered and all-gathered as usual, in a bucket of its own
    biased = Profile("fcb", 1, (FC.layers[0], replace(FC.layers[1], grad_bytes=4 * 36,
                                                        tensors=2)))
    r = simulate(biased, "sharded+exchange", cluster(ranks=4))
    assert r.wire_bytes == pytest.approx(shape.exchange_elements(4) * 4 + 2 * 3 / 4 * 16)
    plan = plan_of(biased, "sharded+exchange", ranks=4)
    assert [(b.collective, [v.name for v in b.variables]) for b in plan.buckets] == [
        ("reducescatter+allgather", ["fc/grad"]), (EXCHANGE, ["fc/kernel"])]
    assert [b.tensors for b in buckets_of(biased, plan=plan)] == [1, 1]
    # a batch where it does not pay: the kernel is reduce-scattered, the bytes are sharded's
    big = replace(FC, batch_size=64)
    assert not DenseShape(8, 4, 64).exchange_pays(2)
    assert simulate(big, "sharded+exchange", c).wire_bytes == pytest.approx(
        simulate(big, "sharded", c).wire_bytes)


def test_exchange_choices_follow_exchange_pays():
    vgg = load_profile("vgg16")
    for p in (8, 128, 512):
        got = {c.layer: c for c in exchange_choices(vgg, p)}
        assert list(got) == ["fc1", "fc2", "predictions"]
        for la in vgg.layers:
            if la.dense:
                shape = DenseShape(*la.dense, batch=vgg.batch_size)
                assert got[la.name].shape == shape
                assert got[la.name].exchanged == shape.exchange_pays(p)
                assert got[la.name].exchange_bytes == pytest.approx(
                    shape.exchange_elements(p) * 4)
    # fc6/fc7 (fc1/fc2 here) pay at moderate P; as P x B grows, fc2 and then fc1 stop paying
    assert [c.exchanged for c in exchange_choices(vgg, 32)] == [True, True, True]
    assert [c.exchanged for c in exchange_choices(vgg, 512)] == [True, False, False]
    assert [c.exchanged for c in exchange_choices(replace(vgg, batch_size=256), 512)] == \
        [False, False, False]


@pytest.mark.parametrize("name", ["vgg16", "mlp-b64-cpu", "vgg-b64-cpu", "resnet50"])
def test_exchange_never_slower_on_a_bandwidth_bound_link(name):
    prof = lab_profile(name)
    exchanged = 0
    for bandwidth in (1.25e8, 1.25e9, 1.25e10):
        for p in (2, 8, 32, 128, 512):
            c = Cluster(ranks=p, bandwidth=bandwidth, cycle_s=0.0)
            pays = any(c.exchanged for c in exchange_choices(prof, p))
            for base in ("sharded", "sharded_hybrid"):
                plain, ex = simulate(prof, base, c), simulate(prof, base + "+exchange", c)
                # a kernel the exchange does not carry keeps a bucket of its own (the layout
                # is fixed before the batch is known): a collective's start-up more; the
                # forward on the rows puts its all-to-alls' start-up on the critical path,
                # exposed where the link hides everything anyway (100 Gbit/s): under 1%
                assert ex.step_s <= plain.step_s * 1.01, (base, bandwidth, p)
                if pays:
                    exchanged += 1
                    assert ex.wire_bytes < plain.wire_bytes
                else:
                    assert ex.wire_bytes == pytest.approx(plain.wire_bytes)
    assert exchanged  # every profile has kernels that pay somewhere


def test_exchange_strategy_without_dense_layers_is_sharded():
    vgg = load_profile("vgg16")
    plain_vgg = replace(vgg, layers=tuple(replace(la, dense=None) for la in vgg.layers))
    c = Cluster(ranks=64, bandwidth=25e9 / 8, latency=1e-5, negotiation_s=5e-4, tensor_s=1e-4)
    for prof in (TWO, THREE, plain_vgg):
        for base in ("sharded", "sharded_hybrid"):
            for kw in ({}, {"bucket_bytes": 100}):
                a = simulate(prof, base, replace(c, **kw))
                b = simulate(prof, f"{base}+exchange", replace(c, **kw))
                assert replace(b, strategy=base) == a, (prof.model, base, kw)
    # with its dense layers, VGG-16's exchange variant differs (and sends less)
    r = simulate(vgg, "sharded+exchange", c)
    assert r.wire_bytes < simulate(vgg, "sharded", c).wire_bytes


def test_profile_round_trip_with_dense(tmp_path):
    prof = Profile("p", 8, (Layer("conv", 1.0, 2.0, 40, tensors=2),
                            Layer("fc", 0.5, 1.0, 4 * (6 * 3 + 3), tensors=2, dense=(6, 3))),
                   update_s=0.1, meta={"source": "test"})
    path = tmp_path / "p.json"
    prof.save(path)
    raw = json.loads(path.read_text())
    assert "dense" not in raw["layers"][0] and raw["layers"][1]["dense"] == [6, 3]
    back = load_profile(path)
    assert back == prof and back.layers[1].dense == (6, 3)
    assert back.layers[1].kernel_bytes == 72 and back.layers[0].kernel_bytes == 0
    # a profile written before the field existed loads without it
    del raw["layers"][1]["dense"]
    assert Profile.from_dict(raw).layers[1].dense is None
    with pytest.raises(ValueError, match="does not fit"):
        Layer("fc", 0.5, 1.0, 4 * 17, dense=(6, 3))
    # the shipped profiles: each dense layer is its kernel plus a bias of n_out
    for name, dense in (("vgg16", {"fc1": (25088, 4096), "fc2": (4096, 4096),
                                   "predictions": (4096, 1000)}),
                        ("resnet50", {"predictions": (2048, 1000)}),
                        ("resnet101", {"predictions": (2048, 1000)}),
                        ("mlp-b64-cpu", {"dense": (3072, 2048), "dense_1": (2048, 2048),
                                         "dense_2": (2048, 10)}),
                        ("vgg-b64-cpu", {"dense": (4096, 1024), "dense_1": (1024, 1024),
                                         "dense_2": (1024, 10)})):
        layers = lab_profile(name).layers
        assert {la.name: la.dense for la in layers if la.dense} == dense, name
        for la in layers:
            if la.dense:
                assert la.grad_bytes == 4 * (la.dense[0] + 1) * la.dense[1], (name, la.name)


def test_simulate_command_shows_the_exchange(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["simulate", "vgg16", "--np", "8,512", "--bandwidth",
                                    "10gbit", "--strategies",
                                    "horovod,sharded,sharded+exchange", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "sharded+exchange" in res.output and "dense factor exchange" in res.output
    assert any(line.split()[:2] == ["8", "fc2"] and line.endswith("exchange+rows")
               for line in res.output.splitlines())
    data = json.loads(out.read_text())["profiles"]["vgg16"]
    assert {(r["ranks"], r["strategy"]) for r in data["results"]} == \
        {(p, s) for p in (8, 512) for s in ("horovod", "sharded", "sharded+exchange")}
    picks = {(c["ranks"], c["layer"]): c["exchanged"] for c in data["exchange"]}
    assert picks == {(8, "fc1"): True, (8, "fc2"): True, (8, "predictions"): True,
                     (512, "fc1"): True, (512, "fc2"): False, (512, "predictions"): False}
    by = {(r["ranks"], r["strategy"]): r for r in data["results"]}
    assert by[8, "sharded+exchange"]["wire_bytes"] < by[8, "sharded"]["wire_bytes"]
    assert set(EXCHANGE_STRATEGIES) == {"sharded+exchange", "sharded_hybrid+exchange"}
