"""Multicast pacing: one group at its slowest member's rate, or two rate classes, measured on the testbed.

    sudo python experiments/rate_classes.py [--quick] [--seeds N]

One sender (heterogeneous-8's p5: 500 Mbit/s up) sends one 4 MB message to the 7 other peers
(downlinks 50-500 Mbit/s), each receiver paced at its downlink or at the sender's uplink share,
whichever is lower (x PACING_HEADROOM, as plan_flows paces), under three policies:
- ``slowest``: every receiver through the sender's group, paced at its slowest member's rate (the
  engine's rule, and what the planner plans);
- ``classes``: two rate classes: the receivers at or above the median rate through the group (paced
  at the slowest of them), the others by unicast at their own rates (the uplink shared so that the
  group and the unicast copies fit it);
- ``unicast``: a copy per receiver, each at its share of the uplink.
Per policy: each receiver's completion time (the sender's per-receiver elapsed time), their mean
and maximum, and the bytes on the sender's uplink (engine counters).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import numpy as np

PORT, MCAST_PORT = 7000, 7100
KEY = bytes(range(32))
POLICIES = ("slowest", "classes", "unicast")


def recv_main(port: int, messages: int) -> None:
    """A receiver: takes `messages` messages, then prints its engine's counters."""
    from p2plearn.transport import Channel

    with Channel(host="0.0.0.0", port=port, sender_id=port, key=KEY, mcast_port=MCAST_PORT) as ch:
        print("ready", flush=True)
        for _ in range(messages):
            if ch.recv(timeout=120) is None:
                raise SystemExit("receiver: nothing arrived in 120 s")
        print(json.dumps(ch.stats()), flush=True)


def rates_for(policy: str, uplink: float, downlinks: list[float]) -> tuple[list[float], list[bool]]:
    """Per receiver: the pacing rate (bytes/s) and whether it goes through the group."""
    from p2plearn.selection import PACING_HEADROOM

    n = len(downlinks)
    if policy == "slowest":
        return [PACING_HEADROOM * min(d, uplink) for d in downlinks], [True] * n
    if policy == "unicast":
        return [PACING_HEADROOM * min(d, uplink / n) for d in downlinks], [False] * n
    median = statistics.median(downlinks)
    fast = [d >= median for d in downlinks]
    copies = 1 + fast.count(False)  # the group's copy and one per slow receiver
    return [PACING_HEADROOM * min(d, uplink / copies) for d in downlinks], fast


def send_main(config: str) -> None:
    """The sender: every policy, `seeds` times, in turn; prints one JSON line per send."""
    from p2plearn.transport import Channel

    cfg = json.loads(config)
    data = [np.random.default_rng(0).standard_normal(int(cfg["megabytes"] * 2**20 / 4)).astype(np.float32)]
    with Channel(host="0.0.0.0", sender_id=0, key=KEY, mcast_port=MCAST_PORT, transport_mode="auto",
                 uplink_rate=cfg["uplink"]) as ch:
        msg = 0
        for seed in range(cfg["seeds"]):
            for policy in POLICIES:
                rates, grouped = rates_for(policy, cfg["uplink"], cfg["downlinks"])
                before = ch.stats()["bytes_sent"]
                msg += 1
                stats = ch.send(msg, data, [(h, PORT, r) for h, r in zip(cfg["hosts"], rates)],
                                multicast=grouped).wait(120)
                print(json.dumps({"policy": policy, "seed": seed, "elapsed": [st.elapsed_s for st in stats],
                                  "results": [st.result for st in stats], "multicast": [st.multicast for st in stats],
                                  "uplink_mb": (ch.stats()["bytes_sent"] - before) / 2**20}), flush=True)
                time.sleep(2.5)  # the receivers leave the group (2 s linger): each policy starts alike


def main(argv: list[str] | None = None) -> None:
    import common as c
    from p2plearn.testbed import Testbed
    from p2plearn.topology import load

    args = c.parse_args(__doc__, argv)
    if not c.is_root():
        msg = "skipped: needs root (network namespaces: IP multicast across the testbed's bridge)"
        print(msg, file=sys.stderr)
        (args.out / "rate_classes.md").write_text(f"# Multicast pacing: slowest member vs two rate classes\n\n{msg}\n")
        return
    topo = load(c.ROOT / "topology" / "heterogeneous-8.json")
    sender, receivers = "p5", [p for p in topo.peers if p != "p5"]
    cfg = {"megabytes": 1.0 if args.quick else 4.0, "seeds": args.seeds, "uplink": topo.uplink_bytes_per_s(sender),
           "downlinks": [topo.downlink_bytes_per_s(p) for p in receivers]}
    script = [c.PY, str(c.ROOT / "experiments" / "rate_classes.py")]
    with Testbed(topo, name="rcls") as tb:
        cfg["hosts"] = [tb.address(p) for p in receivers]
        rx = [tb.run(p, [*script, "recv", str(PORT), str(args.seeds * len(POLICIES))], stdout=subprocess.PIPE,
                     env={"OMP_NUM_THREADS": "1"}, text=True) for p in receivers]
        for proc in rx:
            assert proc.stdout.readline().strip() == "ready"
        tx = tb.run(sender, [*script, "send", json.dumps(cfg)], stdout=subprocess.PIPE, env={"OMP_NUM_THREADS": "1"},
                    text=True)
        out, _ = tx.communicate(timeout=600)
        for proc in rx:
            proc.communicate(timeout=60)
        if tx.returncode:
            raise SystemExit(f"the sender failed ({tx.returncode})")
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        rows.append({**r, "mean_s": statistics.mean(r["elapsed"]), "max_s": max(r["elapsed"])})
    metrics = {m: c.metric(m) for m in ("mean_s", "max_s", "uplink_mb")}
    tables = c.table(rows, ["policy"], metrics, baseline=("slowest",), ratio_of="mean_s")
    heads = " | ".join(f"{p} ({d * 8 / 1e6:.0f} Mbit/s)" for p, d in zip(receivers, cfg["downlinks"]))
    per_receiver = [f"| policy | {heads} |", "|---|" + "---|" * len(receivers)]
    for policy in POLICIES:
        rs = [r for r in rows if r["policy"] == policy]
        per_receiver.append(f"| {policy} | " + " | ".join(
            f"{statistics.median(r['elapsed'][k] for r in rs):.3f}" for k in range(len(receivers))) + " |")
    setup = (f"Testbed (root), heterogeneous-8: {sender} ({cfg['uplink'] * 8 / 1e6:.0f} Mbit/s up) sends "
             f"{cfg['megabytes']:g} MB to the 7 others, {args.seeds} time(s) per policy, the policies in turn. "
             f"Seconds until each receiver's send closed (sender side); uplink MB from the engine's counters.")
    tables += "\n\nMedian seconds per receiver (its downlink)\n\n" + "\n".join(per_receiver)

    def draw(ax) -> None:
        c.bar_chart(ax, rows, ["policy"], lambda r: r["mean_s"], "mean receiver completion (s)",
                    "One sender to 7 receivers: multicast pacing policies")

    c.write_results(args.out, "rate_classes", rows, "Multicast pacing: slowest member vs two rate classes", setup,
                    tables, draw)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "recv":
        recv_main(int(sys.argv[2]), int(sys.argv[3]))
    elif len(sys.argv) > 1 and sys.argv[1] == "send":
        send_main(sys.argv[2])
    else:
        main()
