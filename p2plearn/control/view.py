"""GlobalView: what the coordinator knows of every peer, as numpy arrays indexed by rank."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_ARRAYS = ("uplink", "downlink", "load", "load_msgs", "alive", "clock")
_DTYPES = {"alive": np.bool_, "clock": np.int64}


@dataclass(frozen=True)
class GlobalView:
    """A snapshot of the job, one entry per rank (a rank never seen is not ``alive``).

    - ``uplink`` / ``downlink``: estimated available bandwidth, bytes/s (see BandwidthEstimator);
    - ``load``: bytes in flight towards each peer (sum over senders' latest reports);
    - ``load_msgs``: messages in flight towards each peer;
    - ``alive``: bool mask of live members;
    - ``clock``: each peer's last reported clock (rounds completed);
    - ``round``: the slowest live peer's clock when the snapshot was taken.
    """

    round: int
    uplink: np.ndarray
    downlink: np.ndarray
    load: np.ndarray
    load_msgs: np.ndarray
    alive: np.ndarray
    clock: np.ndarray

    @property
    def size(self) -> int:
        return len(self.alive)

    def to_blobs(self) -> tuple[dict, list[bytes]]:
        """Header and raw frames for the wire (no JSON of large arrays)."""
        arrays = [np.ascontiguousarray(getattr(self, name), dtype=_DTYPES.get(name, np.float64)) for name in _ARRAYS]
        return {"round": self.round, "size": self.size}, [a.tobytes() for a in arrays]

    @classmethod
    def from_blobs(cls, header: dict, blobs: list[bytes]) -> GlobalView:
        if len(blobs) != len(_ARRAYS):
            raise ValueError(f"GlobalView needs {len(_ARRAYS)} arrays, got {len(blobs)}")
        arrays = {name: np.frombuffer(blob, dtype=_DTYPES.get(name, np.float64)) for name, blob in zip(_ARRAYS, blobs)}
        if any(len(a) != header["size"] for a in arrays.values()):
            raise ValueError("GlobalView arrays disagree in length")
        return cls(round=int(header["round"]), **arrays)
