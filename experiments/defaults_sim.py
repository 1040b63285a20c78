"""Claim (issue 44, the defaults at scale): which setting reaches a target accuracy soonest at 64 and
256 peers, in virtual time: today's defaults (BSP, SELMCAST p=1, a round every 16 steps) or
partitioned rounds (a full average at an all-reduce's cost), each plain, --compress fp16 and int4.

    python experiments/defaults_sim.py [--quick] [--report] [--seeds N] [--peers 64,256] [--bursts no|yes|both]
                                       [--name NAME] [--out DIR]

The virtual-time half of what chooses the defaults (experiments/time_to_accuracy.py measures the
same six settings on the 4-peer testbed). `p2plearn-sim train` on sim_scale's networks and replica:
heterogeneous tiers (downlinks 25/50/100 Mbit/s, uplinks 1 or 0.5 of them), steady (and with
`--bursts yes`: a quarter of the peers' downlinks at 0.1x for 2 s every 10 s), i.i.d. shards; the
MNIST-1D MLP (hidden sim_scale.HIDDEN) whose dense message occupies sim_scale.MESSAGE_BYTES on the
network, sim_scale.STEPS local steps, but a round every PERIOD steps, the defaults' period, for
every setting. Time to target: the first evaluation at which the mean accuracy of ranks 0..7
reaches the target, fixed per size from seed 0's curves of all six settings (sim_scale's rule);
ratio: a setting's median / the defaults' in the same run. Quick: 16 peers, steady, one seed.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

import common as c
import sim_scale as scale

from p2plearn.sync.compress import Compressor
from p2plearn.sync.layout import ALIGN
from p2plearn.sync.partitioned import RESYNC_ROUNDS

NAME = "defaults_sim"
PERIOD = 16  # the defaults' (p2plearn.options); sim_scale's own schedule rounds every 4 steps
ROUNDS = scale.STEPS // PERIOD
DEFAULTS = "bsp, selmcast p=1 (defaults)"
SETTINGS = {DEFAULTS: ["--sync", "bsp", "--selection", "selmcast", "--fanout", "1"],
            "partitioned": ["--sync", "partitioned"]}
CODECS = ["none", "fp16", "int4"]
KEYS = ["setting", "compress"]


def run(tmp: Path, cfg: dict, seed: int) -> dict | None:
    """One virtual run of `cfg` with sim_scale's model and schedule at PERIOD (given after
    virtual_run's own --period: argparse keeps the last); its figures, the MB each peer sent and
    the rounds' mean planned time (from the JSON virtual_run leaves in `tmp`)."""
    n = cfg["peers"]
    flags = [*SETTINGS[cfg["setting"]], "--compress", cfg["compress"], "--period", str(PERIOD)]
    r = scale.virtual_run(tmp, scale.topology_file(tmp, n, cfg["bursts"]), n, seed, flags)
    if r is not None:
        partitioned = cfg["setting"] == "partitioned"
        r["mb_per_message"] = model_mb(cfg["compress"], r["parameters"]) if partitioned else r["mb_per_message"]
        r["mb_sent"] = partitioned_mb_sent(n, cfg["compress"], r["parameters"]) if partitioned \
            else ROUNDS * r["average_p"] * r["mb_per_message"]
        rounds = json.loads((tmp / "run.json").read_text())["round_log"]
        r["planned_s"] = statistics.mean(x["planned_s"] for x in rounds)
    return r


def model_mb(codec: str, parameters: int, resync: bool = False) -> float:
    """A whole model's MB on the simulated network in a partitioned round's format: the change in
    `codec` (resync rounds: values, int4's at 8 bits), scaled as the simulator scales it (its
    encoded bytes x MESSAGE_BYTES / the replica's float32 bytes). The simulator's result gives
    bytes_per_message for bsp messages only."""
    if codec == "none":
        return scale.MESSAGE_BYTES / 1e6
    mode = "int8" if resync and codec == "int4" else codec
    return Compressor(mode, None).wire_bytes([parameters]) / (4 * parameters) * scale.MESSAGE_BYTES / 1e6


def partitioned_mb_sent(n: int, codec: str, parameters: int) -> float:
    """MB a peer sends in ROUNDS partitioned rounds, on average over the peers: the scatter (its
    model but its own part, (n-1)/n of it) and the gather (its part to n-1 peers, (n-1)/n of a model
    when the parts are equal), every RESYNC_ROUNDS-th round from round 0 in values."""
    return sum(2 * (n - 1) / n * model_mb(codec, parameters, resync=rnd % RESYNC_ROUNDS == 0) for rnd in range(ROUNDS))


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="64,256", help="comma-separated sizes (default: %(default)s)")
    ap.add_argument("--bursts", choices=("both", "yes", "no"), default="no", help="default: %(default)s")
    ap.add_argument("--name", default=NAME, type=c.results_name,
                    help="results file name, to run sizes in parallel processes "
                         "(default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags, report=True)
    os.chdir(c.ROOT)
    if args.report:  # the stored run's wall time is in its setup text only
        rows = c.read_rows(args.out / f"{args.name}.csv")
        wall = float(re.search(WALL, (args.out / f"{args.name}.md").read_text())[1])
    else:
        rows, wall = run_all(args)
    tables, verdicts = [], []
    tta = c.metric("tta_s")
    for group in c.groups(rows, ["peers", "bursts"]).values():
        target = scale.time_to_target(group)
        head = group[0]
        where = f"{head['peers']} peers, {'bursts' if head['bursts'] else 'steady'}, i.i.d."
        tables.append(f"**{where}** (target {target:.0%})\n\n" + c.table(
            group, KEYS, {"time to target s": tta, "final accuracy": c.metric("final_accuracy"),
                          "MB sent per peer": c.metric("mb_sent"), "MB per model sent": c.metric("mb_per_message"),
                          "round s": c.metric("round_s"), "planned round s": c.metric("planned_s"),
                          "wall s (simulation)": c.metric("wall_s")},
            baseline=(DEFAULTS, "none"), ratio_of="time to target s"))
        verdicts.append(f"- {where}: {soonest(group)}")
    setup = setup_text(rows, any(r["bursts"] for r in rows), wall)

    def draw(ax) -> None:
        last = [r for r in rows if r["ok"] and r["seed"] == 0 and (r["peers"], r["bursts"]) ==
                (rows[-1]["peers"], rows[-1]["bursts"])]
        scale.draw_curves(ax, last, lambda r: f"{r['setting']}, {r['compress']}",
                          f"{rows[-1]['peers']} peers, {'bursts' if rows[-1]['bursts'] else 'steady'}, seed 0")

    c.write_results(args.out, args.name, rows, "The defaults against partitioned rounds and compression at 64-256 "
                    "peers, in virtual time", setup, "\n\n".join(tables), draw, notes="\n".join(verdicts),
                    report=args.report)


def run_all(args) -> tuple[list[c.Row], float]:
    """Every configuration the flags select, each over the seeds; the rows and their wall seconds."""
    sizes, bursts = scale.sizes_and_bursts(args)
    t0 = time.monotonic()
    rows = c.repeat_all(({"peers": n, "bursts": bursty, "data": "iid", "setting": setting, "compress": codec}
                         for n in sizes for bursty in bursts for setting in SETTINGS for codec in CODECS), args.seeds, run)
    return rows, time.monotonic() - t0


def setup_text(rows: list[c.Row], bursty: bool, wall: float) -> str:
    """The results' setup: the model, what a message costs on the network (compressed too), the
    schedule, the network, how time to target and bytes are counted, the run's wall time and load."""
    parameters = next((r["parameters"] for r in rows if r["ok"]), 0)
    bursts = ", bursts: a quarter of the peers' downlinks at 0.1x for 2 s every 10 s" if bursty else ""
    return (f"Virtual time (`p2plearn-sim train`), MNIST-1D MLP hidden {scale.HIDDEN} "
            f"({parameters} parameters) whose dense float32 message occupies "
            f"{scale.MESSAGE_BYTES / 1e6:g} MB on the simulated network (--message-bytes). Compression shrinks it: "
            f"the simulator encodes each peer's message with training's codec and puts its encoded bytes x "
            f"{scale.MESSAGE_BYTES / 1e6:g} MB / the replica's float32 bytes on the network (fp16 0.5 MB, int4 "
            f"{model_mb('int4', parameters):.3g} MB with its scales), for bsp messages and "
            f"partitioned parts alike; a merge costs the calibrated float32 merge's time whatever the format. "
            f"A round every {PERIOD} steps (the defaults' period, for every setting), {scale.STEPS} local steps "
            f"({ROUNDS} rounds), batch 32, SGD lr 0.1 momentum 0.9, {c.seed_count(rows)} seed(s); heterogeneous tiers 25/50/100 "
            f"Mbit/s (uplinks 1 or 0.5 of the downlink){bursts}, "
            f"i.i.d. shards. Cells: median [min-max] over seeds. Time to target: the first evaluation (every "
            f"{scale.EVAL_EVERY} steps) at which the mean accuracy of ranks 0..{scale.EVAL_PEERS - 1}'s own models "
            f"reaches the target (fixed per size from seed 0's curves of all six settings); final accuracy: the "
            f"average model's. MB sent per peer: bsp, rounds x average p x the mean message; partitioned (whose "
            f"result gives no byte count), 2 (n-1)/n of a model per round in the change's format (every "
            f"{RESYNC_ROUNDS}th round from round 0 in values, int4's at 8 bits), parts taken as equal. "
            f"Partitioned parts are cut on {ALIGN}-element boundaries of the replica (about "
            f"{parameters // 256} elements a part at 256 peers, {parameters // 64} at 64) and each flow is paced for "
            f"its part as cut. "
            f"This run: {len(rows)} runs in {wall:.0f} s of wall time. " + c.load_note(rows))


WALL = re.compile(r"This run: \d+ runs in (\d+) s of wall time")  # setup_text's, read back by --report


def soonest(group: list[c.Row]) -> str:
    """The setting with the lowest median time to target, its ratio to the defaults' and the two
    final accuracies (the group's `tta_s` set)."""
    by = c.groups([r for r in group if r["ok"]], KEYS)
    median = {k: c.summary(r["tta_s"] for r in rs)[0] for k, rs in by.items()}
    accuracy = {k: c.summary(r["final_accuracy"] for r in rs)[0] for k, rs in by.items()}
    reached = {k: m for k, m in median.items() if math.isfinite(m)}
    if not reached:
        return "no setting reached the target"
    best, base = min(reached, key=reached.get), (DEFAULTS, "none")
    ratio = (f"{reached[best] / median[base]:.2f}x the defaults' time" if base in reached else
             f"the defaults reached it in {sum(math.isfinite(r['tta_s']) for r in by.get(base, []))} of "
             f"{len(by.get(base, []))} seeds")
    return (f"soonest **{best[0]}, compress {best[1]}** ({reached[best]:.3g} s, {ratio}; final accuracy "
            f"{accuracy[best]:.3f} vs the defaults' {accuracy.get(base, float('nan')):.3f})")


if __name__ == "__main__":
    sys.exit(main())
