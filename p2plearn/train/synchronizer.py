"""`make_synchronizer`: the round core a `DecentralizedOptimizer` drives, with the policies its
options name (rule, selection, tolerance, value filter, outer update, compression, fragments).

Every peer of a job must make it from the same options and seed: the peers plan their rounds
alike, without asking anyone (see `p2plearn.sync`).
"""
from __future__ import annotations

import numpy as np

from p2plearn.filter import make_filter
from p2plearn.options import Options
from p2plearn.protocols import ControlClient, DataChannel
from p2plearn.sync import SYNCHRONIZERS, Synchronizer
from p2plearn.sync.outer import OuterOptimizer
from p2plearn.sync.robust import robust_merge
from p2plearn.tolerance import policy_from_options
from p2plearn.train.layout import ModelLayout


def make_synchronizer(options: Options, layout: ModelLayout, arrays: list[np.ndarray], channel: DataChannel,
                      client: ControlClient, seed: int) -> Synchronizer:
    """The synchronizer of ``options.sync`` over the host `arrays` (one per piece of `layout`),
    sending through `channel`, planning from `client`'s view, starting at its start clock."""
    tolerance = policy_from_options(options)
    extra = {"staleness": options.staleness} if options.sync == "ssp" else {}
    if options.sync in ("bsp", "ssp"):
        extra["robust"] = robust_merge(options)
    value_filter = make_filter("value", granularity=options.filter_granularity, init_scale=options.filter_init_scale,
                               period=options.filter_period) if options.filter == "value" else None
    policy_options = {"max_fanout": options.max_fanout or None, "max_fanin": options.max_fanin or None,
                      "mixing_slack": options.mixing_slack} if options.selection == "selmcast" else None
    return SYNCHRONIZERS[options.sync](
        arrays, layout.layers, channel, client, selection=options.selection, fanout=options.fanout, seed=seed,
        tolerance=tolerance, value_filter=value_filter,
        outer=OuterOptimizer(options.outer_lr, options.outer_momentum), compress=options.compress,
        keep_nonfinite=options.keep_nonfinite, start_clock=client.start_clock, policy_options=policy_options,
        transport_mode=options.transport_mode, layer_ranges=layout.layer_ranges, fragments=options.fragments,
        slow_close=options.slow_close, **extra)
