"""The training-mode options, in one place: flags, environment variables, defaults, validation.

The launcher takes them as flags and passes them to every peer as ``P2PLEARN_*`` variables;
``p2plearn.init()`` reads them back with ``Options.from_env()``. A training script can take the
same flags itself::

    parser = argparse.ArgumentParser()
    p2plearn.options.add_arguments(parser)
    args = parser.parse_args()
    options = Options.from_args(args)          # flags over P2PLEARN_* over defaults

Each field's ``help`` says how to tune it; the environment variable is ``P2PLEARN_`` + the
upper-case field name (``loss_bound`` -> ``P2PLEARN_LOSS_BOUND``).
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .rendezvous.errors import SetupError
from .rendezvous.variables import OTHER_VARS

ENV_PREFIX = "P2PLEARN_"
MAX_RANKS = 1 << 16  # the wire's sender id is 16 bits: a job has at most this many ranks
ROBUST_PARTITIONED = ("--robust: does not apply with --sync partitioned (one peer aggregates each part and sends it "
                      "to all: no receiver has a second copy of a part to clip or compare it with); use --sync bsp or ssp")


class OptionsError(SetupError, ValueError):
    """An option has a value it cannot take; the message names the flag or variable."""


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None,
         valid: tuple[Callable[[Any], bool], str] | None = None) -> Any:
    """A field; ``valid`` = (test of a value, what a value must be: the error names it)."""
    return field(default=default, metadata={"help": help, "choices": choices, "valid": valid})


def _within(low: float, high: float, low_open: bool = False, high_open: bool = False) -> tuple[Callable, str]:
    """The range check of a number, and its wording: [0, 1), 1..65535 for integers."""
    def test(value: float) -> bool:
        return (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
    if isinstance(low, int) and isinstance(high, int) and not (low_open or high_open):
        return test, f"must be in {low}..{high}"
    return test, f"must be in {'(' if low_open else '['}{_number(low)}, {_number(high)}{')' if high_open else ']'}"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"  # 86400000, not 8.64e+07


def _is_multicast_range(text: str) -> bool:
    try:
        return ipaddress.ip_network(text).is_multicast and ipaddress.ip_network(text).version == 4
    except ValueError:
        return False


@dataclass(frozen=True)
class Options:
    sync: str = _opt("bsp", "bsp: every round waits for its senders (or the deadline), and no peer runs more "
                            "than 16 rounds ahead of the slowest; ssp: a peer runs up "
                            "to --staleness rounds ahead of the slowest; partitioned: every round is a full "
                            "average at a ring all-reduce's bytes (each peer aggregates a part sized by its "
                            "bandwidth; --selection and --fanout do not apply)", ("bsp", "ssp", "partitioned"))
    staleness: int = _opt(2, "SSP bound in rounds, 0..100: larger hides more stragglers, but merges older models (and a "
                             "peer keeps staleness + 16 rounds of its senders' messages)", valid=_within(0, 100))
    selection: str = _opt("selmcast", "how each peer picks its receivers per round",
                          ("selmcast", "random", "all", "ring", "exponential"))
    fanout: int = _opt(1, f"receivers per round (p), 1..{MAX_RANKS - 1}: more spreads updates faster and costs more "
                          "bandwidth (a job of n ranks sends to n - 1 at most)", valid=_within(1, MAX_RANKS - 1))
    max_fanout: int = _opt(64, "--selection selmcast: receivers per sender at most (never below --fanout; 0 = no cap); "
                               "SELMCAST adds receivers while the round gets no longer on the links, and this bounds the work "
                               "(set it to --fanout where peers share a host's cores and data is i.i.d.: the extras cost that CPU)",
                         valid=_within(0, MAX_RANKS - 1))
    max_fanin: int = _opt(64, "--selection selmcast: senders per receiver at most (never below --fanout; 0 = no cap); "
                              "bounds the messages a peer buffers and merges in a round", valid=_within(0, MAX_RANKS - 1))
    mixing_slack: float = _opt(0.0, "--selection selmcast: how much longer (0.1: a tenth) a round may take so that a peer "
                                    "whose downlink cannot take a whole message in time still gets a sender",
                               valid=_within(0.0, 10.0))
    loss_bound: float = _opt(0.0, "fraction of a message a receiver may miss, in [0, 1): higher closes "
                                  "rounds sooner on lossy links, at some cost in accuracy",
                             valid=_within(0.0, 1.0, high_open=True))
    tolerance: str = _opt("fixed", "how the loss bound is set per layer and round",
                          ("fixed", "adaptive", "layerwise", "phase"))
    period: int = _opt(16, "local steps between rounds (H): a round every H steps costs 1/H of the communication; "
                          "larger drifts the peers further apart between rounds (4-16 is typical, as in local SGD)",
                   valid=(lambda value: value >= 1, "must be >= 1"))
    fragments: int = _opt(1, "streaming rounds: the exchanged tensors cut, in model order, into F fragments of equal "
                             "bytes (a tensor larger than a share is split); a round runs every period/F steps and "
                             "carries one fragment in turn (round r: fragment r mod F), so each fragment is averaged "
                             "every --period steps at its own offset and a round's message is 1/F of the model. "
                             "--period must be a multiple of F, and --filter value does not apply; 1: every round "
                             "carries the whole model", valid=_within(1, 1024))
    outer_lr: float = _opt(1.0, "step size of the outer update on a round's averaged change (DiLoCo): the model becomes "
                                "its value at the last round + outer-lr x the change; 1 with --outer-momentum 0 is plain "
                                "averaging; DiLoCo uses 0.7 with momentum 0.9; in (0, 2]: beyond 2 each round overshoots the "
                                "average by more than the change itself", valid=_within(0.0, 2.0, low_open=True))
    outer_momentum: float = _opt(0.0, "Nesterov momentum of the outer update, in [0, 1): it carries the averaged change of "
                                      "earlier rounds into later ones; try 0.9 with --outer-lr 0.7 at large --period",
                                valid=_within(0.0, 1.0, high_open=True))
    overlap: bool = _opt(False, "run each round while the next period's local steps compute: a step waits only when a "
                                "round outlasts the period; the round's merge is added to the current parameters as "
                                "a change (one round late), not copied over them")
    overlap_steps: int | None = _opt(None, "--overlap with a bounded delay (tau): a round runs while the next tau local steps "
                                           "compute, then its result is mixed in (a step waits if it is not done); "
                                           "0 <= tau <= period/fragments; implies --overlap (default: the whole round "
                                           "interval, period/fragments steps)", valid=_within(0, 1_000_000))
    overlap_alpha: float | None = _opt(None, "--overlap: how a round's result enters parameters that took local steps since "
                                             "it started: parameters = (1 - alpha) x local + alpha x result, in the "
                                             "arrays the round carried (Streaming DiLoCo's mixing; 1 drops the steps "
                                             "taken meanwhile, lower keeps part of them and of the peers' differences); "
                                             "in (0, 1] (default: none: the round's change is added to the local "
                                             "parameters, every local step kept)", valid=_within(0.0, 1.0, low_open=True))
    staging: str = _opt("direct", "direct: a CPU model's rounds read and merge its own memory (no copy); host: "
                                  "through separate host buffers and copies, exactly as a CUDA model's are (a "
                                  "device model is always staged; this tests that path on the CPU)",
                        ("direct", "host"))
    max_message_mb: float = _opt(256.0, "the torch.distributed backend's largest message, in MiB: a collective "
                                        "that would send a larger one raises on every rank, and it bounds what a "
                                        "key holder can make a rank hold (about 6 x (ranks - 1) x it); lower it to "
                                        "the job's largest collective (DDP: its bucket cap, and its start-up "
                                        "broadcast of min(model, 250 MiB))", valid=_within(0.0, 1e6, low_open=True))
    bucket_mb: float = _opt(25.0, "the exchanged tensors travel and merge in contiguous buckets of at most this many "
                                  "MiB per dtype (DDP's default): a round's Python work grows with the buckets, not "
                                  "the tensors", valid=_within(0.0, 1e6, low_open=True))
    compress: str | None = _opt(None, "send values as fp16 (half the bytes), bf16 (half), int8 with a scale per 256 "
                                      "values (a little over a quarter) or int4 with a scale per 64 (a seventh), with "
                                      "error feedback, merged in float64; fp16's error (5e-4 of a value) is far below "
                                      "an SGD step's, int8's (1/254 of the block's largest) and int4's (1/14) are not, "
                                      "yet error feedback carries what a round left out into the next. none: float32 "
                                      "as trained (default: int4, the soonest to a target of every setting measured "
                                      "(README, Choosing settings); none with --filter value)",
                                ("none", "fp16", "bf16", "int8", "int4"))
    keep_nonfinite: bool = _opt(False, "--compress: merge a peer's NaN and inf values (and int8/int4 scales that read "
                                       "as them) as they come, so that a diverging peer's NaN spreads to every model; "
                                       "by default each receiver refuses them where they are (it keeps its own "
                                       "value there, as for a lost chunk), counts them per sender and logs the "
                                       "first from each")
    robust: str = _opt("none", "bound what a lying member (one that holds the job's secret) does to the models it "
                               "reaches: clip scales a sender's difference from the receiver's model that is over "
                               "--robust-radius x the typical (median) distance down to that typical distance, per 1024 values; trimmed averages each "
                               "value without the largest and smallest sent (with 4 or more senders; fewer: clip); both "
                               "refuse NaN and inf in any format; not with --sync partitioned (see docs/security.md)", ("none", "clip", "trimmed"))
    robust_radius: float = _opt(2.0, "--robust clip: the distance past which a sender is clipped (to the typical one), "
                                     "per 1024 values, as a multiple of the median distance of its senders (this "
                                     "round's and its last 16's); under 1 it is also what a clipped sender keeps; "
                                     "lower clips more honest senders",
                                valid=_within(0.0, 1000.0, low_open=True))
    robust_exclude: bool = _opt(False, "--robust: stop merging from a sender clipped in more than half of its merges "
                                       "(after 8 of them); one log line, counted in the optimizer's stats")
    filter: str = _opt("none", "value: send only updates above a decaying threshold (with residuals)",
                       ("none", "value"))
    filter_granularity: str = _opt("per_element", "--filter value: per_element sends the elements above the threshold "
                                                  "(sparse); per_layer sends whole layers whose mean change is above it",
                                   ("per_element", "per_layer"))
    filter_init_scale: float = _opt(30.0, "--filter value: the first threshold as a multiple of the first round's mean "
                                          "|update| (momentum makes it ~10x smaller than later ones; 30 halved the bytes at -1 point on "
                                          "MNIST-1D with momentum 0.9); higher "
                                          "sends less (and delays more)", valid=(lambda value: value > 0, "must be > 0"))
    filter_period: int = _opt(100, "--filter value: rounds per step of the threshold's decay init/t^(1/2); about "
                                   "an epoch's rounds with a constant learning rate",
                                   valid=(lambda value: value >= 1, "must be >= 1"))
    transport_mode: str = _opt("unicast", "how a round's message reaches its receivers: unicast sends one copy per receiver "
                                          "on the uplink; multicast sends one to the sender's IP multicast group for all "
                                          "of them (a LAN or cluster switch replicates it; a receiver the group does not "
                                          "reach gets it by unicast, a few round trips later); auto probes at start-up which "
                                          "peers multicast reaches, and plans, paces and sends with one group copy for "
                                          "the peers that reach each other both ways (the view's multicast domains) and "
                                          "unicast copies for the rest (mixed networks: several LANs, routed peers)",
                               ("unicast", "multicast", "auto"))
    mcast_groups: str = _opt("239.77.0.0/16", "--transport-mode multicast|auto: the job's group range; rank i sends to "
                                              "the range's i-th group (a /16 gives every rank of up to 65536 its own; "
                                              "a smaller range shares groups, costing receivers downlink)",
                             valid=(_is_multicast_range, "must be a multicast range such as 239.77.0.0/16"))
    mcast_port: int = _opt(47000, "--transport-mode multicast|auto: the UDP port every peer receives multicast data on "
                                  "(the same for the whole job; give concurrent jobs on one LAN different ports or ranges)",
                             valid=_within(1, 65535))
    mcast_ttl: int = _opt(1, "--transport-mode multicast|auto: router hops a multicast datagram may cross (1: the LAN)",
                            valid=_within(1, 255))
    deadline_ms: float | None = _opt(None, "hard limit of a round's transfer in ms (default: none); set it "
                                           "a few times the expected transfer time; at most 86400000 (a day)",
                                       valid=_within(0.0, 86_400_000.0, low_open=True))
    slow_close: float = _opt(0.0, "end a receiver's send once its delivery rate, measured from its ACKs, puts the "
                                  "message's end past this many times the time planned for it (its bytes at its "
                                  "pacing rate): what arrived merges (a missing chunk keeps the receiver's own "
                                  "value), as after a deadline, and a burst on its downlink costs the round a "
                                  "bounded time; try 1.5 where downlinks burst; 0: off",
                              valid=(lambda v: v == 0 or 1 <= v <= 100, "must be 0 (off) or in [1, 100]"))
    topology: str | None = _opt(None, "topology file (node-link JSON) seeding the coordinator's bandwidth view")
    emulate: bool = _opt(False, "pace each engine to its topology rates and inject its loss (no root needed)")
    heartbeat: float = _opt(0.5, "seconds between heartbeats, in [0.01, 60]: smaller detects dead peers sooner (and "
                                 "costs the coordinator a message per peer per heartbeat)", valid=_within(0.01, 60.0))
    phi_threshold: float = _opt(8.0, "suspicion (phi-accrual) at which a silent peer or coordinator is taken for "
                                     "dead: lower detects sooner (~1.4 s at 8 with a 0.5 s heartbeat), with more "
                                     "false deaths on a loaded machine; a false death costs a state transfer; in "
                                     "(0, 300) (phi stops at 300: a higher threshold is never reached)",
                            valid=_within(0.0, 300.0, low_open=True, high_open=True))
    dashboard: str | None = _opt(None, "[HOST:]PORT where the coordinator serves a live, read-only page of the job and "
                                       "its Prometheus /metrics (see docs/monitor.md); HOST defaults to 127.0.0.1 "
                                       "(open it from elsewhere through an ssh tunnel), any other HOST asks for a token "
                                       "derived from the job's secret, carried by the URL printed at start; port 0: a "
                                       "free one. Off by default: a job opens no port nobody asked for, and concurrent "
                                       "jobs on one host do not contend for one",
                                 valid=(lambda v: v.rpartition(":")[2].isdigit() and int(v.rpartition(":")[2]) < 65536,
                                        "must be [HOST:]PORT with a port in 0..65535"))
    log_dir: str | None = _opt(None, "directory where each rank writes its per-round statistics (loss, compute, "
                                     "communication and send seconds, bytes, delivered, merged, deadline hits, slow "
                                     "closes) as rank-N.jsonl and, with the tensorboard package, TensorBoard event "
                                     "files (tensorboard --logdir DIR), and the coordinator its plans and events; "
                                     "p2plearn-run also keeps each rank's output there (rank-N.log) and --report "
                                     "reads it (see docs/monitor.md). Buffered and written every 2 s by a thread "
                                     "of its own: rounds do not wait on it")

    def __post_init__(self) -> None:
        if self.compress is None:  # frozen: the dataclass idiom for a derived field
            object.__setattr__(self, "compress", _default_compress(self.filter))
        for f in fields(self):
            why = _refusal(f, getattr(self, f.name))
            if why:
                raise OptionsError(f"{_flag(f.name)}: {why} (got {getattr(self, f.name)!r})")
        if self.emulate and not self.topology:
            raise OptionsError("--emulate: needs --topology")
        if self.period % self.fragments:
            raise OptionsError(f"--fragments: --period ({self.period}) must be a multiple of --fragments "
                               f"({self.fragments}): a fragment's round runs every period / fragments steps")
        if self.fragments > 1 and self.filter != "none":
            raise OptionsError("--fragments: does not apply with --filter value (the filter picks what travels per "
                               "layer, from the whole model's change)")
        if self.overlap_steps is not None:
            if self.overlap_steps > self.period // self.fragments:
                raise OptionsError(f"--overlap-steps: a round must land before the next one starts: at most "
                                   f"period/fragments = {self.period // self.fragments} (got {self.overlap_steps})")
            object.__setattr__(self, "overlap", True)  # frozen: the dataclass idiom for a derived field
        if self.overlap_alpha is not None and not self.overlap:
            raise OptionsError("--overlap-alpha: applies to overlapped rounds: add --overlap or --overlap-steps")
        if self.robust != "none" and self.sync == "partitioned":
            raise OptionsError(ROBUST_PARTITIONED)
        if self.compress != "none" and self.filter != "none":
            raise OptionsError("--compress: does not apply with --filter value yet (the filter picks what travels)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Options:
        """Options from ``P2PLEARN_*`` variables (``os.environ`` by default), then ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(_env(f.name))
            if raw is not None and raw != "" and f.name not in overrides:  # a flag given wins, even over a bad variable
                values[f.name] = _parse(f, raw, lambda why, f=f, raw=raw: OptionsError(
                    f"{_flag(f.name)}: {why} (got {raw!r} from {_env(f.name)})"))
        for name in overrides:
            if name not in {f.name for f in fields(cls)}:
                raise OptionsError(f"unknown option {name!r}")
        return cls(**{**values, **overrides})

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Options:
        """Options from flags added by ``add_arguments``; a flag not given falls back to the environment."""
        given = {f.name: getattr(args, f.name) for f in fields(cls) if getattr(args, f.name, None) is not None}
        return cls.from_env(environ, **given)

    def to_env(self) -> dict[str, str]:
        """The ``P2PLEARN_*`` variables that make ``from_env`` return these options."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[_env(f.name)] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return out

    def replace(self, **changes: Any) -> Options:
        """These options with ``changes``; a compress that was the default follows a changed filter."""
        if "filter" in changes and "compress" not in changes and self.compress == _default_compress(self.filter):
            changes["compress"] = None
        return replace(self, **changes)


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """One line per ``P2PLEARN_*`` variable in ``environ`` that nothing reads (a typo, most often:
    ``P2PLEARN_SYNCH``), naming the nearest known one; ``init()`` and p2plearn-run say them."""
    known = [name[len(ENV_PREFIX):] for name in (*(_env(f.name) for f in fields(Options)), *OTHER_VARS)]
    lines = []
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX):] not in known:
            near = difflib.get_close_matches(name[len(ENV_PREFIX):], known, n=1)
            hint = f"; did you mean {ENV_PREFIX}{near[0]}?" if near else ""
            lines.append(f"p2plearn: {name} is not a p2plearn variable, ignored{hint}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--sync``, ``--staleness``, ... to ``parser`` (defaults None: not given -> environment)."""
    group = parser.add_argument_group("training mode (also P2PLEARN_* environment variables)")
    for f in fields(Options):
        shown = "" if "(default" in f.metadata["help"] else f" (default: {'none' if f.default is None else f.default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": f.metadata["help"] + shown}
        if f.type in ("bool",):
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        elif f.metadata["choices"]:  # argparse says "invalid choice" itself
            kwargs["choices"] = f.metadata["choices"]
            kwargs["metavar"] = "|".join(f.metadata["choices"])
        else:  # refused by argparse with its usage line, as a bad choice is
            kwargs["type"] = lambda raw, f=f: _parse(
                f, raw, lambda why: argparse.ArgumentTypeError(f"{why} (got {raw!r})"))
            kwargs["metavar"] = f.name.upper()
        group.add_argument(_flag(f.name), **kwargs)
    return parser


def _parse(f: Any, raw: str, error: Callable[[str], Exception]) -> Any:
    """The value of option ``f`` written ``raw``, or ``error(why)`` raised when it cannot take it."""
    kind = f.type.replace(" | None", "")
    try:
        if kind == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError
            value = raw.lower() in ("1", "true", "yes")
        else:
            value = {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError:
        raise error(f"not a valid {kind}") from None
    why = _refusal(f, value)
    if why:
        raise error(why)
    return value


def _default_compress(filter: str) -> str:
    """The codec when --compress is not given: int4 (measured soonest), none where the filter picks values."""
    return "int4" if filter == "none" else "none"


def _refusal(f: Any, value: Any) -> str | None:
    """Why option ``f`` cannot take ``value`` (type, choices, range), or None when it can; the
    caller adds the value and where it came from."""
    kind = f.type.replace(" | None", "")
    if value is None:
        return None if f.default is None else "must be given"
    if kind == "bool":
        return None if isinstance(value, bool) else "must be true or false"
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        return "must be an integer"
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        return "must be a finite number"  # nan passes no comparison; inf passes a lower bound
    if kind == "str" and not isinstance(value, str):
        return "must be a string"
    if f.metadata["choices"] and value not in f.metadata["choices"]:
        return f"must be one of {', '.join(f.metadata['choices'])}"
    if f.metadata["valid"] and not f.metadata["valid"][0](value):
        return f.metadata["valid"][1]
    return None


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
