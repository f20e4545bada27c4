"""``hvd-overlap simulate``: predicted step times of the strategies on a cluster (and, with
``--growth``, the time to a target epoch of a run whose batch grows)."""

from __future__ import annotations

import click

from hvd_overlap.core.simulate import STRATEGIES as SIM_STRATEGIES
from hvd_overlap.core.strategy import REGISTRY


@click.command()
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
        # a registered strategy of one's own (``core.strategy.register``) by its plain name too
        own = tuple(n for n, c in REGISTRY.items() if not c().tuned)
        unknown = [s for s in names if s not in sim.STRATEGIES + tuple(autos) + own]
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
                    "auto": [{"as": name, "ranks": c.result.ranks, **c.best.factory_keywords(),
                              "speedup_vs_stock": c.speedup} for name, c in choices.get(p, [])],
                    "growth": [report.growth_dict(t) for t in grown.get(p, [])]}
                for p, (prof, results) in runs.items()}}, indent=1))
    if plot_path:
        report.plot_scaling(plot_path, {titles[p]: res for p, (_, res) in runs.items()},
                             dict(zip(titles.values(), published, strict=False)))
