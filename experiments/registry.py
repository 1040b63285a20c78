"""Every stored result in experiments/results/: the command that reproduces it and the code it measures.

One entry per results name (`<name>.md`, with its .csv/.png where the writer makes them). The command
is run from the repository root (`make experiments` runs them all, in this order); `measures` lists
the git pathspecs whose changes can move the file's figures: `python experiments/stale.py` names the
files whose measured code changed since the commit they record, and tests/test_claims.py refuses a
README or docs figure from such a file unless the text says it is from an older version.

Tune `measures` to what a run exercises: too wide and every unrelated change marks the claims stale,
too narrow and a change that moves the figures goes unnoticed. A change inside measured code that
only some runs reach says so in its commit message: the trailer `Moves-results: NAME ...` names the
results it can move (the others stay fresh), and the message says why the rest cannot. A new experiment (or a new variant of
one, e.g. another `--name`) adds its entry here; the test checks that every results file has one.
"""
from __future__ import annotations

from dataclasses import dataclass

# The pieces a run can exercise, as git pathspecs (a directory covers everything under it).
# The robust merge runs only under --robust: the experiments of lying members measure it (ROBUST).
ROBUST = ["native/robust.c", "p2plearn/sync/robust.py"]
_NOT_ROBUST = [f":(exclude){p}" for p in ROBUST]
ENGINE = ["native", "setup.py", _NOT_ROBUST[0]]
# What a training job runs: the optimizer, rounds, selection, tolerance, control plane, launcher.
TRAINING = [*ENGINE, "p2plearn", ":(exclude)p2plearn/sim", ":(exclude)p2plearn/bench", ":(exclude)p2plearn/monitor",
            ":(exclude)p2plearn/ddp.py", ":(exclude)p2plearn/distributed", ":(exclude)p2plearn/checkpoint.py",
            _NOT_ROBUST[1], "topology", "experiments/common.py"]
# What virtual time runs: training's planner, codec, partitioned round and merge in one process.
SIMULATOR = ["p2plearn/sim", "p2plearn/selection", "p2plearn/sync", "p2plearn/tolerance", "p2plearn/filter",
             "p2plearn/control", "p2plearn/topology", "p2plearn/train", "p2plearn/compute.py", "native", "topology",
             "experiments/common.py", *_NOT_ROBUST]
DDP = [*TRAINING, "p2plearn/ddp.py", "p2plearn/distributed"]
BENCH = [*TRAINING, "p2plearn/bench"]


@dataclass(frozen=True)
class Entry:
    """How one results file is made: `command` (from the repository root; `sudo` where it needs the
    testbed's namespaces) and `measures` (git pathspecs of the code its figures depend on)."""

    command: str
    measures: tuple[str, ...]


def _entry(command: str, *groups: list[str]) -> Entry:
    """An entry measuring `groups` and the script (or module) that `command` runs. A path one group
    excludes and another includes (TRAINING leaves out p2plearn/bench, BENCH adds it) is measured:
    git applies a pathspec's exclusions after its inclusions, so the exclusion is dropped."""
    script = command.split()[command.split().index("python") + 1] if "python" in command.split() else ""
    own = [script] if script.startswith("experiments/") else []
    paths = list(dict.fromkeys(own + [p for g in groups for p in g]))
    return Entry(command, tuple(p for p in paths if not (p.startswith(":(exclude)") and p[len(":(exclude)"):] in paths)))


_MNIST_TORCH = ["experiments/torch_mnist1d.py"]
_CHARLM_TORCH = ["experiments/torch_charlm.py"]
_SVR = "sudo python experiments/selmcast_vs_random.py"
_SIM_SCALE = "python experiments/sim_scale.py --peers 256"
_SLOW = "python experiments/sim_slow_close.py"
_DEFAULTS_SIM = "python experiments/defaults_sim.py"
_SIM_SCALE_CODE = ["experiments/sim_scale.py", "experiments/selmcast_vs_random.py"]
_ATTACKS_TRANSFORMER = "python experiments/attacks_transformer.py"
_ATTACKS_TRANSFORMER_CODE = (TRAINING, ROBUST, ["experiments/attack_peer.py", "experiments/sim_scale.py"])

RESULTS: dict[str, Entry] = {
    "time_to_accuracy": _entry("sudo python experiments/time_to_accuracy.py", TRAINING, _MNIST_TORCH),
    "time_to_accuracy_streaming": _entry("sudo python experiments/time_to_accuracy.py --rows streaming",
                                         TRAINING, _MNIST_TORCH),
    "time_to_accuracy_change": _entry("sudo python experiments/time_to_accuracy.py --rows change",
                                      TRAINING, _MNIST_TORCH),
    "time_to_accuracy_mixing": _entry("sudo python experiments/time_to_accuracy.py --rows mixing --seeds 2",
                                      TRAINING, _MNIST_TORCH),
    "time_to_accuracy_fast": _entry("sudo python experiments/time_to_accuracy.py --rows fast", TRAINING, _MNIST_TORCH),
    "charlm_time_to_loss": _entry("sudo python experiments/charlm_time_to_loss.py", TRAINING, _CHARLM_TORCH),
    "charlm_time_to_loss_streaming": _entry("sudo python experiments/charlm_time_to_loss.py --rows streaming",
                                            TRAINING, _CHARLM_TORCH),
    "selmcast_vs_random": _entry(f"{_SVR} --part 8", TRAINING),
    "selmcast_vs_random_capped": _entry(f"{_SVR} --part 8 --max-fanout 1", TRAINING),
    "selmcast_vs_random_16": _entry(f"{_SVR} --part 16", TRAINING),
    "selmcast_vs_random_16_capped": _entry(f"{_SVR} --part 16 --max-fanout 1", TRAINING),
    "selmcast_vs_random_16_slow": _entry(f"{_SVR} --slow-close 1.5", TRAINING),
    "selmcast_vs_random_16_slow_ssp": _entry(f"{_SVR} --slow-close 1.5 --ssp", TRAINING),
    "selmcast_16_diagnosis": _entry("python experiments/selmcast_16_diagnosis.py", SIMULATOR,
                                    ["experiments/selmcast_vs_random.py"]),
    "multicast_16": _entry("sudo python experiments/multicast_16.py", TRAINING),
    "multicast_16_steady": _entry("sudo python experiments/multicast_16.py --steady", TRAINING),
    "multicast_16_slow": _entry("sudo python experiments/multicast_16.py --slow-close 1.5", TRAINING),
    "rate_classes": _entry("sudo python experiments/rate_classes.py", TRAINING),
    "loss_tolerance_vs_tcp": _entry("sudo python experiments/loss_tolerance_vs_tcp.py", TRAINING,
                                    ["experiments/exchange_peer.py"]),
    "layerwise_bounds": _entry("python experiments/layerwise_bounds.py", TRAINING),
    "phase_aware": _entry("sudo python experiments/phase_aware.py", TRAINING),
    "value_filter": _entry("python experiments/value_filter.py", TRAINING),
    "faults": _entry("python experiments/faults.py", TRAINING, ["experiments/fault_peer.py"]),
    "ddp_vs_gloo": _entry("sudo python experiments/ddp_vs_gloo.py", DDP, ["experiments/ddp_peer.py"]),
    "scale": _entry("python experiments/scale.py", SIMULATOR),
    "sim_budget": _entry("python experiments/sim_budget.py", SIMULATOR),
    "sim_tolerance": _entry("python experiments/sim_tolerance.py", SIMULATOR),
    "sim_value_filter": _entry("python experiments/sim_value_filter.py", SIMULATOR),
    "sim_train_validation": _entry("python experiments/sim_train_validation.py", SIMULATOR),
    "attacks": _entry("python experiments/attacks.py", SIMULATOR, ROBUST),
    "attacks_sim": _entry("python experiments/attacks_sim.py --configs 64:bsp,64:ssp,256:bsp,256:ssp --jobs 2",
                          SIMULATOR, ROBUST, ["experiments/attacks.py"]),
    # real training; the attacks' definitions (p2plearn/sim/attacks.py) are left out with the rest of p2plearn/sim
    "attacks_transformer": _entry(_ATTACKS_TRANSFORMER, *_ATTACKS_TRANSFORMER_CODE),
    "attacks_transformer_ssp": _entry(f"{_ATTACKS_TRANSFORMER} --sync ssp --name attacks_transformer_ssp",
                                      *_ATTACKS_TRANSFORMER_CODE),
    "attacks_transformer_16": _entry(f"{_ATTACKS_TRANSFORMER} --peers 16 --name attacks_transformer_16",
                                     *_ATTACKS_TRANSFORMER_CODE),
    "attacks_transformer_16_ssp": _entry(f"{_ATTACKS_TRANSFORMER} --peers 16 --sync ssp "
                                         "--name attacks_transformer_16_ssp", *_ATTACKS_TRANSFORMER_CODE),
    "sim_scale": _entry("python experiments/sim_scale.py --peers 16,64", SIMULATOR),
    "sim_scale_256_steady": _entry(f"{_SIM_SCALE} --bursts no --name sim_scale_256_steady", SIMULATOR),
    "sim_scale_256_bursts_iid": _entry(f"{_SIM_SCALE} --bursts yes --sync bsp --data iid "
                                       "--name sim_scale_256_bursts_iid", SIMULATOR),
    "sim_scale_256_bursts_dirichlet": _entry(f"{_SIM_SCALE} --bursts yes --sync bsp --data dirichlet "
                                             "--name sim_scale_256_bursts_dirichlet", SIMULATOR),
    "defaults_sim": _entry(f"{_DEFAULTS_SIM} --peers 64 --bursts both", SIMULATOR, _SIM_SCALE_CODE),
    "defaults_sim_256": _entry(f"{_DEFAULTS_SIM} --peers 256 --name defaults_sim_256", SIMULATOR, _SIM_SCALE_CODE),
    "sim_slow_close": _entry(_SLOW, SIMULATOR),
    "sim_slow_close_ssp": _entry(f"{_SLOW} --sync ssp --slow 0,1.5 --name sim_slow_close_ssp", SIMULATOR),
    "sim_slow_close_256": _entry(f"{_SLOW} --peers 256 --slow 0,1.5 --selections selmcast:1,random:1,exponential:1 "
                                 "--name sim_slow_close_256", SIMULATOR),
    "sim_slow_close_steady": _entry(f"{_SLOW} --bursts no --data iid --slow 0,1.5 "
                                    "--selections selmcast:1,random:1,exponential:1 --name sim_slow_close_steady",
                                    SIMULATOR),
    # Written by the library's own tools, outside experiments/: they print or store what the file quotes.
    "sim_validation": _entry("sudo python -m p2plearn.sim.validate", SIMULATOR, TRAINING),
    "unequal_pacing": _entry("sudo python -m p2plearn.sim.unequal", SIMULATOR, TRAINING),
    "view_tracking": _entry("sudo python -m p2plearn.sim.tracking --testbed", SIMULATOR, TRAINING),
    "bench_average": _entry("sudo python -m p2plearn.bench average --rounds 8", BENCH),
    "bench_average_gpt2": _entry("sudo python -m p2plearn.bench average --model gpt2-small "
                                 "--topologies loopback,homogeneous-4 --rounds 5", BENCH),
    "bench_merge": _entry("python -m p2plearn.bench merge --repeats 31", ROBUST,
                          ["native/merge.c", "native/contribution.c", "native/contribution.h", "native/compute.h",
                           "p2plearn/sync/merge.py", "p2plearn/bench/merge.py", "setup.py"]),
    "bench_rounds_transport": _entry("sudo python experiments/bench_rounds_transport.py", BENCH),
    "bench_transport": _entry("sudo python -m p2plearn.bench transport --reps 3", ENGINE, ["p2plearn/transport",
                                                                                        "p2plearn/bench"]),
    "round_cpu": _entry("python experiments/round_cpu.py", BENCH, DDP),
    "gpu_charlm": _entry("OUT=gpu-results bash experiments/gpu_charlm.sh", TRAINING, _CHARLM_TORCH,
                         ["experiments/gpu_charlm.sh"]),
}


def entry(name: str) -> Entry:
    """The entry of results name `name` (KeyError names the file that lacks one)."""
    try:
        return RESULTS[name]
    except KeyError:
        raise KeyError(f"experiments/results/{name}.md has no entry in experiments/registry.py") from None
