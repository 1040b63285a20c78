"""`make_channel`: the data engine a `DecentralizedOptimizer` owns, sized for the job's messages.

Its limits (the largest message, partial and queued bytes) are bounded by what the job itself
sends, so a key holder cannot make a peer allocate more; ``--emulate`` gives it this rank's uplink
rate and loss from ``--topology``; ``--transport-mode`` its multicast settings.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from p2plearn.keys import data_key
from p2plearn.options import Options
from p2plearn.runtime import Runtime
from p2plearn.transport import CHUNK_CLAIM, Channel, message_bytes


def make_channel(runtime: Runtime, options: Options, round_arrays: list[np.ndarray],
                 model_arrays: list[np.ndarray], params: list[torch.Tensor]) -> Channel:
    """An engine for `runtime`'s rank, bounded by its largest message: a round's (`round_arrays`),
    a whole model's (`model_arrays`: a joiner's state, a final model) or a filtered one of `params`."""
    host = runtime.engine_host()
    kwargs: dict[str, Any] = {}
    if options.emulate:
        if not options.topology:
            raise ValueError("--emulate needs --topology")
        kwargs["uplink_rate"], kwargs["drop_prob"] = _emulated_link(options, runtime.rank)
        kwargs["seed"] = runtime.rank + 1
        kwargs["max_datagram"] = 1472  # the emulated links are Ethernet: 1500-byte MTU, not loopback's 64 KiB
    if options.transport_mode != "unicast":
        kwargs.update(transport_mode=options.transport_mode, mcast_port=options.mcast_port,
                      mcast_groups=options.mcast_groups, mcast_ttl=options.mcast_ttl)
    # What a key holder can make this peer allocate, bounded by what the job sends: its largest
    # message (the model; with the value filter every tensor as float32, plus its header and an
    # index array per layer), and a few of them from every member at once (rounds in flight, or
    # the root of the final average, which takes one from each).
    widest = [np.broadcast_to(np.float32(0), (p.numel(),)) for p in params]  # per layer: filtered or cut by bounds
    largest = max(message_bytes(round_arrays), message_bytes(model_arrays),
                  message_bytes(widest)) + 64 * (2 * len(widest) + 1) + 4096
    # Delivered messages wait for the next drain (between rounds, while steps compute): from every
    # member, its rounds up to the staleness bound ahead of this peer's, a state and a final model.
    members, claim = max(runtime.world_size, 2), largest + CHUNK_CLAIM
    secret, job = runtime.secret, runtime.job_id
    return Channel(host=host, sender_id=runtime.rank, job_id=job,
                   key=data_key(secret.value, job) if secret else None, max_message_bytes=largest,
                   max_partial_bytes=3 * members * claim,
                   max_queued_bytes=(options.staleness + 3) * members * claim, **kwargs)


def _emulated_link(options: Options, rank: int) -> tuple[float, float]:
    """(uplink bytes/s, loss) of this rank's node in the topology, for --emulate."""
    from p2plearn.topology import load

    topo = load(options.topology)
    nodes = [peer for peer in topo.peers for _ in range(topo.slots(peer))]
    if rank >= len(nodes):
        raise ValueError(f"{options.topology} has {len(nodes)} peer slots, rank {rank} has none")
    return topo.uplink_bytes_per_s(nodes[rank]), topo.loss(nodes[rank])
