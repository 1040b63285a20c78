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
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

ENV_PREFIX = "P2PLEARN_"


class OptionsError(ValueError):
    """An option has a value it cannot take; the message names the flag or variable."""


def _opt(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class Options:
    sync: str = _opt("bsp", "bsp: every round waits for its senders (or the deadline), and no peer runs more "
                            "than 16 rounds ahead of the slowest; ssp: a peer runs up "
                            "to --staleness rounds ahead of the slowest; partitioned: every round is a full "
                            "average at a ring all-reduce's bytes (each peer aggregates a part sized by its "
                            "bandwidth; --selection and --fanout do not apply)", ("bsp", "ssp", "partitioned"))
    staleness: int = _opt(2, "SSP bound in rounds: larger hides more stragglers, but merges older models")
    selection: str = _opt("selmcast", "how each peer picks its receivers per round",
                          ("selmcast", "random", "all", "ring", "exponential"))
    fanout: int = _opt(1, "receivers per round (p): more spreads updates faster and costs more bandwidth")
    max_fanout: int = _opt(64, "--selection selmcast: receivers per sender at most (never below --fanout; 0 = no cap); "
                               "SELMCAST adds receivers while the round gets no longer, and this bounds the work")
    max_fanin: int = _opt(64, "--selection selmcast: senders per receiver at most (never below --fanout; 0 = no cap); "
                              "bounds the messages a peer buffers and merges in a round")
    mixing_slack: float = _opt(0.0, "--selection selmcast: how much longer (0.1: a tenth) a round may take so that a peer "
                                    "whose downlink cannot take a whole message in time still gets a sender")
    loss_bound: float = _opt(0.0, "fraction of a message a receiver may miss, in [0, 1): higher closes "
                                  "rounds sooner on lossy links, at some cost in accuracy")
    tolerance: str = _opt("fixed", "how the loss bound is set per layer and round",
                          ("fixed", "adaptive", "layerwise", "phase"))
    period: int = _opt(16, "local steps between rounds (H): a round every H steps costs 1/H of the communication; "
                          "larger drifts the peers further apart between rounds (4-16 is typical, as in local SGD)")
    outer_lr: float = _opt(1.0, "step size of the outer update on a round's averaged change (DiLoCo): the model becomes "
                                "its value at the last round + outer-lr x the change; 1 with --outer-momentum 0 is plain "
                                "averaging; DiLoCo uses 0.7 with momentum 0.9")
    outer_momentum: float = _opt(0.0, "Nesterov momentum of the outer update, in [0, 1): it carries the averaged change of "
                                      "earlier rounds into later ones; try 0.9 with --outer-lr 0.7 at large --period")
    overlap: bool = _opt(False, "run each round while the next period's local steps compute: a step waits only when a "
                                "round outlasts the period; the round's merge is added to the current parameters as "
                                "a change (one round late), not copied over them")
    compress: str = _opt("none", "send values as fp16 (half the bytes), bf16 (half) or int8 with a scale per 256 "
                                 "values (a little over a quarter), with error feedback, merged in float32; fp16's "
                                 "error (5e-4 of a value) is far below an SGD step's, int8's (1/254 of the block's "
                                 "largest) is not", ("none", "fp16", "bf16", "int8"))
    filter: str = _opt("none", "value: send only updates above a decaying threshold (with residuals)",
                       ("none", "value"))
    filter_granularity: str = _opt("per_element", "--filter value: per_element sends the elements above the threshold "
                                                  "(sparse); per_layer sends whole layers whose mean change is above it",
                                   ("per_element", "per_layer"))
    filter_init_scale: float = _opt(30.0, "--filter value: the first threshold as a multiple of the first round's mean "
                                          "|update| (momentum makes it ~10x smaller than later ones; 30 halved the bytes at -1 point on "
                                          "MNIST-1D with momentum 0.9); higher "
                                          "sends less (and delays more)")
    filter_period: int = _opt(100, "--filter value: rounds per step of the threshold's decay init/t^(1/2); about "
                                   "an epoch's rounds with a constant learning rate")
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
                                              "a smaller range shares groups, costing receivers downlink)")
    mcast_port: int = _opt(47000, "--transport-mode multicast|auto: the UDP port every peer receives multicast data on "
                                  "(the same for the whole job; give concurrent jobs on one LAN different ports or ranges)")
    mcast_ttl: int = _opt(1, "--transport-mode multicast|auto: router hops a multicast datagram may cross (1: the LAN)")
    deadline_ms: float | None = _opt(None, "hard limit of a round's transfer in ms (default: none); set it "
                                           "a few times the expected transfer time")
    topology: str | None = _opt(None, "topology file (node-link JSON) seeding the coordinator's bandwidth view")
    emulate: bool = _opt(False, "pace each engine to its topology rates and inject its loss (no root needed)")
    heartbeat: float = _opt(0.5, "seconds between heartbeats: smaller detects dead peers sooner")
    phi_threshold: float = _opt(8.0, "suspicion (phi-accrual) at which a silent peer or coordinator is taken for "
                                     "dead: lower detects sooner (~1.4 s at 8 with a 0.5 s heartbeat), with more "
                                     "false deaths on a loaded machine; a false death costs a state transfer")

    def __post_init__(self) -> None:
        for f in fields(self):
            choices = f.metadata["choices"]
            if choices and getattr(self, f.name) not in choices:
                raise OptionsError(f"{_flag(f.name)}: {getattr(self, f.name)!r} is not one of {', '.join(choices)}")
        checks = [
            ("staleness", self.staleness >= 0, "must be >= 0"),
            ("fanout", self.fanout >= 1, "must be >= 1"),
            ("max_fanout", self.max_fanout >= 0, "must be >= 0"),
            ("max_fanin", self.max_fanin >= 0, "must be >= 0"),
            ("mixing_slack", 0.0 <= self.mixing_slack <= 10.0, "must be in [0, 10]"),
            ("period", self.period >= 1, "must be >= 1"),
            ("outer_lr", self.outer_lr > 0, "must be > 0"),
            ("outer_momentum", 0.0 <= self.outer_momentum < 1.0, "must be in [0, 1)"),
            ("loss_bound", 0.0 <= self.loss_bound < 1.0, "must be in [0, 1)"),
            ("filter_init_scale", self.filter_init_scale > 0, "must be > 0"),
            ("filter_period", self.filter_period >= 1, "must be >= 1"),
            ("deadline_ms", self.deadline_ms is None or self.deadline_ms > 0, "must be > 0"),
            ("mcast_groups", _is_multicast_range(self.mcast_groups), "must be a multicast range such as 239.77.0.0/16"),
            ("mcast_port", 1 <= self.mcast_port <= 65535, "must be in 1..65535"),
            ("mcast_ttl", 1 <= self.mcast_ttl <= 255, "must be in 1..255"),
            ("heartbeat", self.heartbeat > 0, "must be > 0"),
            ("phi_threshold", self.phi_threshold > 0, "must be > 0"),
            ("emulate", not self.emulate or self.topology, "needs --topology"),
            ("compress", self.compress == "none" or self.filter == "none", "does not apply with --filter value yet "
                                                                          "(the filter picks what travels)"),
        ]
        for name, ok, why in checks:
            if not ok:
                got = "" if isinstance(getattr(self, name), bool) else f" (got {getattr(self, name)!r})"
                raise OptionsError(f"{_flag(name)}: {why}{got}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Options:
        """Options from ``P2PLEARN_*`` variables (``os.environ`` by default), then ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = environ.get(_env(f.name))
            if raw is not None and raw != "":
                values[f.name] = _parse(f, raw, f"{_env(f.name)}={raw}")
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
        return replace(self, **changes)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--sync``, ``--staleness``, ... to ``parser`` (defaults None: not given -> environment)."""
    group = parser.add_argument_group("training mode (also P2PLEARN_* environment variables)")
    for f in fields(Options):
        shown = "" if "(default" in f.metadata["help"] else f" (default: {'none' if f.default is None else f.default})"
        kwargs: dict[str, Any] = {"dest": f.name, "default": None, "help": f.metadata["help"] + shown}
        if f.type in ("bool",):
            kwargs["action"] = "store_const"
            kwargs["const"] = True
        else:
            kwargs["type"] = lambda raw, f=f: _parse(f, raw, _flag(f.name), argparse.ArgumentTypeError)
            kwargs["metavar"] = f.name.upper()
            if f.metadata["choices"]:
                kwargs["choices"] = f.metadata["choices"]
                kwargs["metavar"] = "|".join(f.metadata["choices"])
        group.add_argument(_flag(f.name), **kwargs)
    return parser


def _parse(f: Any, raw: str, where: str, error: type[Exception] = OptionsError) -> Any:
    kind = f.type.replace(" | None", "")
    try:
        if kind == "bool":
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError
            return raw.lower() in ("1", "true", "yes")
        return {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError:
        raise error(f"{where}: not a valid {kind}") from None


def _is_multicast_range(text: str) -> bool:
    try:
        return ipaddress.ip_network(text).is_multicast and ipaddress.ip_network(text).version == 4
    except ValueError:
        return False


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")
