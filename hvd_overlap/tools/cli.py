"""``hvd-overlap``: inspect plans and Horovod timelines, profile models, measure a cluster's
collective costs, and predict the strategies' step times on a cluster. (The benchmarks are the
repository's own lab, ``python -m benchmarks``, not part of the package.)"""

from __future__ import annotations

import click

from hvd_overlap.core.plan import DEFAULT_BUCKET_BYTES
from hvd_overlap.core.simulate import STRATEGIES as SIM_STRATEGIES


@click.group()
@click.version_option(package_name="hvd-overlap")
def main() -> None:
    """hvd-overlap: layer-ordered, overlapped gradient communication for Horovod + Keras."""


@main.command()
@click.argument("model_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--strategy", default="layerwise", show_default=True,
              help="a strategy in the plugin's spelling: NAME[+OPTION...], e.g. "
                   "sharded+exchange+rows, hybrid+defer=2+bucket=8M")
@click.option("--bucket-bytes", type=int, default=None,
              help=f"the bucket budget (default {DEFAULT_BUCKET_BYTES}; or +bucket=N)")
@click.option("--exchange", type=click.Choice(["never", "auto", "always"]), default="never",
              show_default=True, help="sharded: the dense factor exchange (or +exchange)")
@click.option("--exchange-forward", type=click.Choice(["auto", "gather", "rows"]),
              default="auto", show_default=True,
              help="with --exchange: the exchanged kernels' forward (or +gather, +rows)")
@click.option("--np", "ranks", type=int, default=2, show_default=True,
              help="ranks (the exchange's choice)")
@click.option("--batch-size", type=int, default=32, show_default=True,
              help="per rank (the exchange's choice; each dense layer taken as called once)")
def plan(model_file: str, strategy: str, bucket_bytes: int | None, exchange: str,
         exchange_forward: str, ranks: int, batch_size: int) -> None:
    """Print the communication plan of a saved Keras model (.keras or .h5)."""
    import tensorflow as tf

    from hvd_overlap.comm.planner import var_specs
    from hvd_overlap.core.exchange import NEVER, DenseShape, label_exchange
    from hvd_overlap.core.spelling import resolve
    from hvd_overlap.core.strategies import get_strategy

    try:
        chosen = resolve(strategy, bucket_bytes=bucket_bytes or DEFAULT_BUCKET_BYTES,
                         exchange=exchange, exchange_forward=exchange_forward)
    except (TypeError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    if chosen.tuned:
        raise click.UsageError(f"{chosen.spec()}: 'auto' settings are chosen while training; "
                               "name the plan to print (e.g. --strategy hybrid+bucket=8M)")
    options = chosen.plan_options(ranks)
    model = tf.keras.models.load_model(model_file, compile=False)
    kernels: frozenset = frozenset()
    if options.exchange != NEVER:
        from hvd_overlap.keras.exchange import exchangeable_layers

        kernels = frozenset(layer.kernel.ref() for layer in exchangeable_layers(model))
    specs = var_specs(model.trainable_variables, exchangeable=kernels)
    built = get_strategy(chosen.name).build_plan(specs, options)
    if options.exchange != NEVER:
        built = label_exchange(built, {s.index: DenseShape(*s.shape, batch=batch_size)
                                       for s in specs if s.exchangeable}, options.exchange,
                               ranks, options.exchange_forward)
    click.echo(built.describe())


@main.command()
@click.argument("timeline_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--limit", type=int, default=40, show_default=True, help="rows to print")
@click.option("--per-step", type=int, default=None,
              help="collectives per step (default: a step is one occurrence of every name)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Gantt chart of the first steps (.png)")
@click.option("--plot-steps", type=int, default=4, show_default=True, help="steps in the plot")
def timeline(timeline_file: str, limit: int, per_step: int | None, plot_path: str | None,
             plot_steps: int) -> None:
    """List the collectives of a Horovod timeline in the order they ran, with their times, then
    per step: communication time, the part hidden behind backprop, and the order."""
    from hvd_overlap.tools.timeline import merge_groups, read_timeline
    from hvd_overlap.tools.timeline_report import analyze, format_steps, plot_gantt

    trips = merge_groups(read_timeline(timeline_file))
    if not trips:
        raise click.ClickException(f"{timeline_file}: no completed collectives in this timeline")
    if per_step is not None and per_step < 1:
        raise click.UsageError("--per-step must be at least 1")
    t0 = trips[0].enqueued
    click.echo(f"{'start_ms':>9} {'wait_ms':>8} {'comm_ms':>8}  {'op':<10} tensor")
    for c in trips[:limit]:
        click.echo(f"{(c.start - t0) / 1e3:>9.2f} {(c.start - c.enqueued) / 1e3:>8.2f} "
                   f"{(c.end - c.start) / 1e3:>8.2f}  {c.op:<10} {c.tensor}")
    steps = analyze(trips, per_step)
    click.echo("")
    click.echo(format_steps(steps, limit))
    if plot_path:
        plot_gantt(plot_path, steps, plot_steps)
    total = sum(c.end - c.start for c in trips) / 1e3
    comm, hidden = sum(r.comm for r in steps) / 1e3, sum(r.hidden for r in steps) / 1e3
    outside = len(trips) - sum(len(r.collectives) for r in steps)
    click.echo(f"{len(trips)} collectives ({outside} outside steps) in {len(steps)} steps, "
               f"{total:.1f} ms on the wire in "
               f"all; hidden behind backprop {hidden:.1f} of {comm:.1f} ms "
               f"({100 * hidden / comm if comm else 0:.0f}%)")







def _load_model(spec: str, image_size: int):
    """A bench model, a ``tf.keras.applications`` one, or ``module:function`` returning one."""
    import importlib

    from hvd_overlap.tools.flops import APPLICATIONS, build_application
    from hvd_overlap.tools.models import MODELS, build_model

    if spec in MODELS:
        return build_model(spec)
    if spec in APPLICATIONS:
        return build_application(spec, image_size)
    if ":" not in spec:
        raise click.UsageError(f"MODEL {spec!r}: a bench model ({', '.join(MODELS)}), an "
                               f"application ({', '.join(APPLICATIONS)}) or module:function")
    module, func = spec.split(":", 1)
    return getattr(importlib.import_module(module), func)()


@main.command()
@click.argument("model_spec", metavar="MODEL")
@click.option("--batch-size", type=int, default=64, show_default=True, help="per rank")
@click.option("--device-tflops", type=float,
              help="derive compute from FLOPs at this rate (TFLOP/s) instead of measuring here")
@click.option("--image-size", type=int, default=224, show_default=True,
              help="input size of the applications (resnet50, resnet101, vgg16)")
@click.option("--repeats", type=int, default=5, show_default=True, help="steps per median")
@click.option("-o", "--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="profile JSON to write")
def profile(model_spec: str, batch_size: int, device_tflops: float | None, image_size: int,
            repeats: int, out_path: str) -> None:
    """Per-layer forward/backward seconds and gradient bytes of MODEL, in forward order.

    MODEL is a bench model (vgg, resnet20, mlp), resnet50 / resnet101 / vgg16 (224x224,
    random weights), or module:function returning a Keras model. Without --device-tflops the
    times are measured on this host (run it as the ranks run: pinned, e.g. `taskset -c 0`,
    with TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS set).
    """
    import os

    import numpy as np

    model = _load_model(model_spec, image_size)
    name = model_spec.rsplit(":", 1)[-1]
    if device_tflops is not None:
        from hvd_overlap.tools.flops import flops_profile

        prof = flops_profile(model, batch_size, device_tflops, name)
    else:
        from hvd_overlap.tools.profile import measured_profile

        shape = (batch_size, *model.input_shape[1:])
        x = np.random.default_rng(0).random(shape, dtype=np.float32)
        prof = measured_profile(model, x, repeats, name)
        prof.meta["conditions"] = {
            "cores": sorted(os.sched_getaffinity(0)), **{k: os.environ.get(k) for k in (
                "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}}
    prof.save(out_path)
    click.echo(f"{prof.model}: {len(prof.layers)} layers, {prof.grad_bytes / 2**20:.1f} MiB of "
               f"gradients, compute {prof.compute_s * 1e3:.1f} ms/step at batch "
               f"{prof.batch_size} ({prof.meta['source']}) -> {out_path}")


@main.command()
@click.argument("profile_paths", metavar="[PROFILE]...", nargs=-1)
@click.option("--np", "np_", default="2-4096", show_default=True,
              help="rank counts: 64, 2,8,64, or a power-of-two range 2-4096")
@click.option("--bandwidth", default="25gbit", show_default=True,
              help="per-rank link: 10gbit, 100gbit, or bytes/s")
@click.option("--latency", default="10us", show_default=True, help="per ring hop")
@click.option("--strategies", default=",".join(SIM_STRATEGIES + ("auto",)), show_default=True,
              help="'auto': what strategy='auto' picks (every plan, the exchange "
                   "included; stock unless beaten); 'auto_whole': the same among whole-state "
                   "plans (an optimizer that cannot be sharded); 'auto_sharded': the "
                   "fastest sharded one (bucket_bytes='auto'); 'sharded+exchange', "
                   "'sharded_hybrid+exchange': with exchange='auto' (the dense factor "
                   "exchange; each dense layer's choice is listed)")
@click.option("--cycle-ms", type=float, default=1.0, show_default=True,
              help="HOROVOD_CYCLE_TIME")
@click.option("--negotiation-ms", type=float,
              help="per-cycle coordination at 2 ranks [default: measured, 2 Gloo ranks]")
@click.option("--negotiation-growth", type=click.Choice(["log2", "linear", "none"]),
              help="how coordination grows with ranks [default: the calibration's fitted "
                   "law, else log2]")
@click.option("--calibration", "calibration_path", type=click.Path(exists=True, dir_okay=False),
              help="measured costs at several rank counts (python -m benchmarks calibrate "
                   "--np 2 --np 3 --np 4): negotiation and per-tensor costs with their fitted "
                   "growth, each collective's share of --bandwidth")
@click.option("--calibration-net", help="the calibration's network (e.g. '1gbit hosts')")
@click.option("--tensor-us", type=float, help="cost per tensor [default: measured, 2 Gloo ranks]")
@click.option("--cpu-steal", type=float, default=0.0, show_default=True,
              help="share of compute lost while a transfer runs (0 on GPUs)")
@click.option("--comm-slowdown", type=float, default=1.0, show_default=True,
              help="transfers take this much longer while compute runs (1 on GPUs)")
@click.option("--fusion-mb", type=float, default=128, show_default=True,
              help="HOROVOD_FUSION_THRESHOLD (MiB)")
@click.option("--bucket-mb", type=float, default=4, show_default=True, help="plan bucket_bytes")
@click.option("--defer", type=int,
              help="input-side buckets deferred to the next step by hybrid, sharded and "
                   "sharded_hybrid (-1: all) [default: half the bytes; sharded: all]")
@click.option("--device-tflops", type=float,
              help="re-time FLOPs profiles at this rate (TFLOP/s)")
@click.option("--published", "published", multiple=True, type=float,
              help="a published efficiency at the largest --np, one per PROFILE (plot star)")
@click.option("--markdown", "md_path", type=click.Path(dir_okay=False),
              help="also write a markdown table here (efficiency per ranks)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="write results")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="efficiency against ranks, one panel per PROFILE (.png)")
@click.option("--growth", help="a batch-growth schedule, EPOCHSxBATCH,... in global batches "
                               "(3x256,3x512,24x1024): also print the time per epoch and to "
                               "--target-epoch of stock and of auto re-choosing its plan per "
                               "phase, each with the growth and with the first batch")
@click.option("--samples", type=int, help="with --growth: training samples per epoch")
@click.option("--target-epoch", type=int,
              help="with --growth: the epoch that reaches the target [default: the last]")
@click.option("--epoch-overhead", "epoch_overhead", default="0s", show_default=True,
              help="with --growth: fixed time per epoch (evaluation, callbacks): 2s, 300ms")
@click.option("--trace-overhead", "trace_overhead", default="0s", show_default=True,
              help="with --growth: the train function's tracing at the first step (your first "
                   "step's time less a steady one's), and after a comma at the first new batch "
                   "(Keras traces once more there): 2s,300ms [default again: the first]")
@click.option("--batch-compute", "batch_compute",
              help="with --growth: the compute-only step measured at per-rank batches, "
                   "16=5ms,64=11ms,256=44ms: each phase's compute is interpolated from them "
                   "[default: the profile's, scaled with the batch]")
def simulate(profile_paths: tuple[str, ...], np_: str, bandwidth: str, latency: str,
             strategies: str, cycle_ms: float, negotiation_ms: float | None,
             negotiation_growth: str | None, calibration_path: str | None,
             calibration_net: str | None, tensor_us: float | None, cpu_steal: float,
             comm_slowdown: float, fusion_mb: float, bucket_mb: float, defer: int | None,
             device_tflops: float | None, published: tuple[float, ...],
             md_path: str | None, json_path: str | None, plot_path: str | None,
             growth: str | None, samples: int | None, target_epoch: int | None,
             epoch_overhead: str, trace_overhead: str, batch_compute: str | None) -> None:
    """Predict the step time of each strategy on a cluster from PROFILEs (files from
    `hvd-overlap profile`, or shipped ones: resnet50, resnet101, vgg16), and with --growth
    the time to a target epoch of a run whose batch grows."""
    import json
    from dataclasses import replace
    from pathlib import Path

    from hvd_overlap.core import autoplan, growth_time
    from hvd_overlap.core import simulate as sim
    from hvd_overlap.tools import simulate_report as report

    if not profile_paths:
        raise click.UsageError(f"give a PROFILE (shipped: {', '.join(sim.shipped_profiles())}"
                               ", or a file from hvd-overlap profile)")
    if published and len(published) != len(profile_paths):
        raise click.UsageError("--published: one value per PROFILE")
    if (samples or target_epoch or batch_compute) and not growth:
        raise click.UsageError("--samples, --target-epoch and --batch-compute go with --growth")
    if growth and not samples:
        raise click.UsageError("--growth needs --samples (training samples per epoch)")
    try:
        calibrated, net_key = None, None
        if calibration_path:
            net_key, calibrated = report.calibrated_knobs(calibration_path, calibration_net,
                                                          bandwidth)
        cluster = report.cluster_from_options(
            2, bandwidth, latency, calibrated, cycle_s=cycle_ms * 1e-3,
            negotiation_s=None if negotiation_ms is None else negotiation_ms * 1e-3,
            negotiation_growth=negotiation_growth,
            tensor_s=None if tensor_us is None else tensor_us * 1e-6, cpu_steal=cpu_steal,
            comm_slowdown=comm_slowdown, fusion_bytes=int(fusion_mb * 2**20),
            bucket_bytes=int(bucket_mb * 2**20))
        names = [s.strip() for s in strategies.split(",") if s.strip()]
        autos = {"auto": "every", "auto_whole": "whole", "auto_sharded": "sharded"}
        unknown = [s for s in names if s not in sim.STRATEGIES + tuple(autos)]
        if unknown or not names:
            raise ValueError(f"--strategies {','.join(unknown) or '(empty)'}: choose from "
                             f"{', '.join(sim.STRATEGIES + tuple(autos))}")
        ranks = report.parse_ranks(np_)
        first, _, again = trace_overhead.partition(",")
        overheads = growth_time.Overheads(
            report.parse_duration(epoch_overhead), report.parse_duration(first),
            report.parse_duration(again) if again else None)
        compute_at = report.parse_batch_compute(batch_compute) if batch_compute else None
        phases = growth_time.parse_schedule(growth) if growth else ()
        runs, choices, exchanges, grown = {}, {}, {}, {}
        for path in profile_paths:
            prof = sim.load_profile(path)
            if device_tflops is not None:
                if not prof.meta.get("device_tflops"):
                    raise ValueError(f"{path}: --device-tflops re-times FLOPs profiles only "
                                     "(`hvd-overlap profile --device-tflops`)")
                prof = prof.scaled(prof.meta["device_tflops"] / device_tflops)
            results = sim.sweep(prof, cluster, ranks, [n for n in names if n not in autos],
                                defer)
            choices[path] = []
            for name in (n for n in names if n in autos):
                picked = autoplan.sweep(prof, cluster, ranks, autos[name])
                choices[path] += [(name, c) for c in picked]
                results += [replace(c.result, strategy=name) for c in picked]
            results.sort(key=lambda r: (ranks.index(r.ranks), r.strategy in autos))
            runs[path] = (prof, results)
            exchanging = [n for n in names if n in sim.EXCHANGE_STRATEGIES]
            exchanges[path] = [c for p in ranks for c in sim.exchange_choices(
                prof, p, exchanging[0], cluster.bucket_bytes)] if exchanging else []
            if phases:
                grown[path] = [t for p in ranks if (t := growth_time.run_times(
                    prof, replace(cluster, ranks=p), phases, samples, target_epoch,
                    overheads, compute_at)) is not None]
    except (ValueError, FileNotFoundError) as e:
        raise click.UsageError(str(e)) from None
    measured_at = ", ".join(str(p) for p, *_ in cluster.measured_costs)
    costs = (f"negotiation and per-tensor cost measured at {measured_at} ranks "
             f"({calibration_path}: {net_key}), beyond them grown by "
             f"{cluster.negotiation_growth}(P) and {cluster.tensor_growth}(P)"
             if cluster.measured_costs else
             f"negotiation {cluster.negotiation_s * 1e3:.3f} ms x "
             f"{cluster.negotiation_growth}(P), {cluster.tensor_s * 1e6:.0f} us/tensor")
    link = f"link {bandwidth}/rank"
    if calibration_path and json.loads(Path(calibration_path).read_text())["nets"][net_key][
            "laws"]["rate"] is None:
        link = (f"collective rates as measured ({calibration_path} names no link rate: "
                "--bandwidth unused)")
    click.echo(f"{link}, latency {latency}/hop, cycle {cycle_ms} ms, fusion "
               f"{fusion_mb:g} MiB, {costs}, cpu steal {cpu_steal}, comm slowdown "
               f"{comm_slowdown}" + ("" if defer is None else f", defer {defer}"))
    for path, (prof, results) in runs.items():
        click.echo(f"\n{prof.model}: batch {prof.batch_size}/rank, "
                   f"{prof.grad_bytes / 2**20:.1f} MiB of gradients, compute "
                   f"{prof.compute_s * 1e3:.1f} ms/step")
        click.echo(report.format_results(results))
        for name, c in choices.get(path, []):
            click.echo(f"{name} at {c.result.ranks} ranks: {c.reason()}")
        if exchanges[path]:
            click.echo("\ndense factor exchange (exchange='auto'), per dense layer: MiB one "
                       "rank sends per step")
            click.echo(report.format_exchange(exchanges[path]))
        if phases:
            click.echo(f"\ngrowth {growth} (global batches), {samples} samples per epoch, "
                       f"{overheads.epoch_s:g} s per epoch, {overheads.trace_s:g} s tracing "
                       f"at the start and {overheads.again_s:g} s at the first new batch "
                       "besides the steps, compute " + (
                           "interpolated from --batch-compute" if compute_at
                           else "scaled with the batch"))
            click.echo(report.format_growth(grown[path], ranks))
    titles = {p: f"{prof.model} (b{prof.batch_size}), {bandwidth}"
              for p, (prof, _) in runs.items()}
    if md_path:
        Path(md_path).write_text(report.efficiency_markdown(
            {titles[p]: res for p, (_, res) in runs.items()}))
    if json_path:
        Path(json_path).write_text(json.dumps(
            {"cluster": cluster.__dict__, "profiles": {
                p: {"model": prof.model, "batch_size": prof.batch_size,
                    "compute_s": prof.compute_s, "results": [r.to_dict() for r in results],
                    "exchange": [c.to_dict() for c in exchanges[p]],
                    "auto": [{"as": name, "ranks": c.result.ranks, **c.best.keywords(),
                              "speedup_vs_stock": c.speedup} for name, c in choices.get(p, [])],
                    "growth": [report.growth_dict(t) for t in grown.get(p, [])]}
                for p, (prof, results) in runs.items()}}, indent=1))
    if plot_path:
        report.plot_scaling(plot_path, {titles[p]: res for p, (_, res) in runs.items()},
                             dict(zip(titles.values(), published, strict=False)))


@main.command()
@click.option("--json", "json_path", type=click.Path(dir_okay=False), required=True,
              help="the calibration file: created, or this measurement added to it")
@click.option("--name", "net_name", default="cluster", show_default=True,
              help="the network's name in the file (one file can hold several; simulate "
                   "--calibration-net picks one)")
@click.option("--link", help="the link's nominal rate per rank (25gbit, 100gbit): each "
                             "collective's rate is then kept as a share of it, which "
                             "simulate --bandwidth scales")
@click.option("--repeats", type=int, default=9, show_default=True,
              help="collectives timed per size (their median counts; fewer: quicker)")
def calibrate(json_path: str, net_name: str, link: str | None, repeats: int) -> None:
    """Measure this job's collective costs for `simulate --calibration`: run it under
    `horovodrun -np N` (N >= 2), then again at other rank counts with the same --json
    (2 among them): how the costs grow with the ranks is fitted over them."""
    import json
    from pathlib import Path

    import horovod.tensorflow as hvd

    from hvd_overlap.core.sim.cluster import parse_rate
    from hvd_overlap.tools import collective_costs as cc

    try:  # the same arguments on every rank: each refuses them before any collective
        rate = None if link is None else parse_rate(link)
    except ValueError as e:
        raise click.UsageError(f"--link {link!r}: {e}") from None
    if repeats < 1:
        raise click.UsageError("--repeats: at least 1")
    path = Path(json_path)

    def problem() -> str | None:  # rank 0's file, agreed on by every rank
        if hvd.size() < 2:
            return "run it under horovodrun -np N with N >= 2 (one rank has no collectives)"
        if hvd.rank() != 0:
            return None
        if not path.parent.is_dir():
            return f"--json {json_path}: no folder {path.parent}"
        try:
            cc.check_file(json.loads(path.read_text()) if path.exists() else {}, json_path)
        except (ValueError, json.JSONDecodeError) as e:
            return f"--json {json_path}: {e}"
        return None

    hvd.init()
    why = hvd.broadcast_object(problem(), root_rank=0, name="hvdo.calibrate.check")
    hvd.shutdown()
    if why:
        raise click.UsageError(why)
    measured = cc.measure_cycles(repeats)
    ranks = hvd.size()
    if measured is not None:  # rank 0
        command = (f"horovodrun -np {ranks} hvd-overlap calibrate --json {json_path} --name "
                   f"{net_name}" + (f" --link {link}" if link else "")
                   + (f" --repeats {repeats}" if repeats != 9 else ""))
        old = json.loads(path.read_text()) if path.exists() else {}
        doc = cc.record(old, net_name, ranks, measured, rate, command)
        path.write_text(json.dumps(doc, indent=1) + "\n")
        click.echo(f"{net_name}, {ranks} ranks: {cc.fit_line(measured['fit'])} -> {json_path}")
        laws = doc["nets"][net_name].get("laws")
        if laws:
            click.echo(f"{net_name}, laws over {laws['ranks']} ranks: {cc.laws_line(laws)}")
        elif ranks != 2 and "fit" not in doc["nets"][net_name]:
            click.echo("run it at 2 ranks too: the laws are anchored there")
        else:
            click.echo("run it at another rank count too: the laws need two")
    hvd.shutdown()
