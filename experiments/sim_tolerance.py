"""Claim (the seeds' tolerance claims, at scale): under microbursts, phase-aware bounds reach a target
accuracy sooner than exact delivery at its final accuracy, per-layer bounds keep accuracy at least
as well as one fixed bound at the same overall loss, and the adaptive policy (Early Close with a
measured deadline) cuts the rounds bursts stretch.

    python experiments/sim_tolerance.py [--quick] [--seeds N] [--peers 16,64,256] [--out DIR]

In virtual time (`p2plearn-sim train`), microburst-N (every link 100 Mbit/s; every 5 s each peer's
downlink falls to 10 Mbit/s with 20% loss for 0.25 s, staggered), i.i.d. shards, BSP, SELMCAST
p=1 (the defaults); exact (fixed 0), fixed 0.05, layerwise 0.05 (the same overall bound), phase
(middle bound 0.05) and adaptive (its own bounds and deadline); the model, schedule and message
size of `sim_scale` (MNIST-1D MLP, --message-bytes 1 MB, a round every 4 steps, 160 steps).
Time to target: as sim_scale (target fixed from seed 0's curves). Ratio: each policy's median /
exact's. Quick: 16 peers, exact / fixed / phase, one seed.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import common as c
import sim_scale as scale

from p2plearn.topology import microburst, save

NAME = "sim_tolerance"
POLICIES = [("fixed", 0.0), ("fixed", 0.05), ("layerwise", 0.05), ("phase", 0.05), ("adaptive", 0.0)]


def run(tmp: Path, cfg: dict, seed: int) -> dict | None:
    topology = tmp / f"microburst-{cfg['peers']}.json"
    if not topology.exists():
        save(microburst(cfg["peers"]), topology)
    return scale.virtual_run(tmp, topology, cfg["peers"], seed,
                             ["--tolerance", cfg["tolerance"], "--loss-bound", str(cfg["loss_bound"])])


def extra_flags(ap) -> None:
    ap.add_argument("--peers", default="16,64,256", help="comma-separated sizes (default: %(default)s)")


def main(argv: list[str] | None = None) -> None:
    args = c.parse_args(__doc__, argv, extra=extra_flags)
    os.chdir(c.ROOT)
    sizes = [16] if args.quick else [int(x) for x in args.peers.split(",")]
    policies = POLICIES[:2] + POLICIES[3:4] if args.quick else POLICIES
    rows: list[c.Row] = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="p2psim-") as tmp:
        for n in sizes:
            for tolerance, bound in policies:
                cfg = {"peers": n, "tolerance": tolerance, "loss_bound": bound}
                rows += c.repeat(cfg, args.seeds, lambda seed, cfg=cfg: run(Path(tmp), cfg, seed))
    print(f"{len(rows)} runs in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    tables, verdicts = [], []
    tta = c.metric("tta_s")
    for group in c.groups(rows, ["peers"]).values():
        target = scale.time_to_target(group)
        medians = {(r["tolerance"], r["loss_bound"]): c.summary(tta(x) for x in group
                                                                if (x["tolerance"], x["loss_bound"]) ==
                                                                (r["tolerance"], r["loss_bound"]))[0] for r in group}
        finals = {(r["tolerance"], r["loss_bound"]): c.summary(x["final_accuracy"] for x in group if x["ok"] and
                                                               (x["tolerance"], x["loss_bound"]) ==
                                                               (r["tolerance"], r["loss_bound"]))[0] for r in group}
        exact = medians[("fixed", 0.0)]
        n = group[0]["peers"]
        verdicts.append(f"- {n} peers (target {target:.0%}): time to target / exact's: " + ", ".join(
            f"{t} {b:g} **{m / exact:.2f}** (final {finals[(t, b)]:.3f} vs {finals[('fixed', 0.0)]:.3f})"
            for (t, b), m in medians.items() if (t, b) != ("fixed", 0.0)))
        tables.append(f"**{n} peers** (target {target:.0%})\n\n" + c.table(
            group, ["peers", "tolerance", "loss_bound"],
            {"time to target s": tta, "final accuracy": c.metric("final_accuracy"), "delivered": c.metric("delivered"),
             "round s": c.metric("round_s"), "average p": c.metric("average_p"),
             "wall s (simulation)": c.metric("wall_s")}))
    setup = (f"Virtual time (`p2plearn-sim train`), microburst-N (100 Mbit/s links; every 5 s each peer's downlink "
             f"at 10 Mbit/s with 20% loss for 0.25 s, staggered), i.i.d., BSP, SELMCAST p=1; MNIST-1D MLP hidden "
             f"{scale.HIDDEN} ({rows[0].get('parameters', '?')} parameters) whose message occupies "
             f"{scale.MESSAGE_BYTES / 1e6:g} MB on the simulated network (--message-bytes), a round every "
             f"{scale.PERIOD} steps, {scale.STEPS} local steps, batch 32, {args.seeds} seed(s). Cells: median "
             f"[min-max] over seeds. Accuracy: the mean over ranks 0..{scale.EVAL_PEERS - 1}'s own models; final: "
             f"the average model's. Virtual times do not depend on the host's load (the step time is the cached "
             f"calibration). " + c.load_note(rows))

    def draw(ax) -> None:
        shown = [r for r in rows if r["ok"] and r["seed"] == 0 and r["peers"] == sizes[-1]]
        scale.draw_curves(ax, shown, lambda r: f"{r['tolerance']} {r['loss_bound']:g}", f"microburst-{sizes[-1]}, seed 0")

    c.write_results(args.out, NAME, rows, "Loss tolerance under microbursts at scale, in virtual time", setup,
                    "\n\n".join(tables), draw, notes="\n".join(verdicts))


if __name__ == "__main__":
    sys.exit(main())
