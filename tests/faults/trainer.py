"""A small training peer for the fault tests: started like torchrun starts peers (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), so that rank 0 starts the coordinator's process.

    python trainer.py (--seconds T | --steps N) [--step-time S] [--average [--ask-root-again S]] --out DIR

Prints ``ready <rank> <pid> <coordinator pid or 0>`` once training starts and writes DIR/rank-R.json
at the end (with ``--average``, after ``average_model``: ``averaged_from``, the ranks whose models
the average holds where this peer made it, else None, and ``average_s``, the seconds the call
took; with ``--ask-root-again S``, ``asked_again``: the result of a sender's second send of its
final model, S s after the first was acknowledged, as a sender whose acknowledgements were lost
asks again): its engine's address, steps taken, rounds, merges, rejoins, coordinator changes, peers mixed with, and the
wall time (time.time()) and clock of every step, the control-plane events it saw, the multicast
domains of its views as they changed, and every round's receivers, senders, merged senders, comm
seconds and the order of the view that planned it (``rounds_log``: what a failed test is read from).
"""

import argparse
import json
import os
import sys
import time

import torch

import p2plearn
from p2plearn.train import DecentralizedOptimizer


def main() -> int:
    parser = argparse.ArgumentParser()
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--seconds", type=float, help="train this long after the rendezvous")
    budget.add_argument("--steps", type=int, help="train this many steps (as an epoch loop does)")
    parser.add_argument("--step-time", type=float, default=0.05, help="seconds of 'compute' per step")
    parser.add_argument("--average", action="store_true", help="end with average_model(), as the examples do")
    parser.add_argument("--ask-root-again", type=float, metavar="S",
                        help="a sender sends its final model again S s after the root acknowledged it")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rt = p2plearn.init(timeout=60.0)
    torch.manual_seed(rt.rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = DecentralizedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, rt)
    events = []
    rt.client.on_event(lambda e: events.append((time.time(), e.kind, e.rank)))
    coordinator_pid = rt.coordinator.proc.pid if rt.coordinator is not None else 0
    print(f"ready {rt.rank} {os.getpid()} {coordinator_pid}", flush=True)
    x, y = torch.randn(256, 32), torch.randint(0, 4, (256,))
    times, clocks, rounds = [], [], []
    domains_seen = []  # each new multicast domains vector of the views this peer held, in order
    until, step = time.monotonic() + (args.seconds or float("inf")), 0
    while time.monotonic() < until and (args.steps is None or step < args.steps):
        try:
            _step(opt, model, x, y, step, args.step_time)
        except Exception:
            # What a failed test is read from: where this peer stood and what it had seen.
            print("state " + json.dumps({"step": step, "clock": opt.sync.clock, "min_clock": rt.client.min_clock,
                                         "members": sorted(rt.client.members), "events": events[-12:],
                                         "clocks": clocks[-5:], "rounds": rounds[-3:]}), flush=True)
            raise
        step += 1
        times.append(time.time())
        clocks.append(opt.sync.clock)
        rs = opt.last_round  # None, or the same round again, on a step without a round (--period)
        if rs is not None and (not rounds or rounds[-1][0] != rs.round):
            view = rt.client.view_for(rs.round)
            rounds.append([rs.round, rs.receivers, rs.senders, rs.merged_from, round(rs.comm_s, 3),
                           list(view.order) if view is not None else None])
        if _domains(rt.client.view) != (domains_seen or [None])[-1]:
            domains_seen.append(_domains(rt.client.view))
    averaged_from, average_s, asked_again = None, 0.0, []
    if args.ask_root_again is not None:
        _ask_root_again(opt, args.ask_root_again, asked_again)
    if args.average:
        t0 = time.monotonic()
        averaged = opt.average_model()
        average_s = time.monotonic() - t0
        averaged_from = opt.averaged_from if averaged is not None else None
    st = opt.stats()
    result = {"rank": rt.rank, "engine": list(opt.channel.address), "steps": step, "rounds": st.rounds, "merges": st.merges,
              "rejoins": st.rejoins, "coordinator_changes": st.coordinator_changes,
              "mixed_with": sorted(st.mixed_with), "times": times, "clocks": clocks, "events": events,
              "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
              "domains_seen": domains_seen, "rounds_log": rounds, "averaged_from": averaged_from,
              "average_s": average_s, "asked_again": asked_again}
    with open(os.path.join(args.out, f"rank-{rt.rank}.json"), "w") as f:
        json.dump(result, f)
    opt.close()
    return 0


def _step(opt: DecentralizedOptimizer, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, step: int,
          step_time: float) -> None:
    i = (step * 32) % 256
    loss = torch.nn.functional.cross_entropy(model(x[i:i + 32]), y[i:i + 32])
    loss.backward()
    time.sleep(step_time)
    opt.step(loss=loss)
    opt.zero_grad()


def _ask_root_again(opt: DecentralizedOptimizer, after_s: float, results: list[bool]) -> None:
    """Make this peer's final-average send to another rank ask again `after_s` s after it was
    acknowledged (each second send's outcome in `results`): what a sender whose acknowledgements
    were lost on the way back does, retransmitting until the root's engine answers."""
    final = opt.final_average
    send = final._send_final

    def send_twice(receiver, engine, until):
        if not send(receiver, engine, until):
            return False
        time.sleep(after_s)
        results.append(send(receiver, engine, until))
        return results[-1]

    final._send_final = send_twice


def _domains(view) -> list[int] | None:
    """The multicast domain of every rank in the last view (None: unicast only)."""
    return None if view is None or view.mcast_domain is None else [int(d) for d in view.mcast_domain]


if __name__ == "__main__":
    sys.exit(main())
