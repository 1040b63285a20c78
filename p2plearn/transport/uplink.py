"""`UplinkMeter`: the most bytes per second an engine put on its uplink, measured while training.

    meter = UplinkMeter(opt.channel)   # starts sampling the engine's bytes-sent counter
    ...                                # training
    peak = meter.stop()                # bytes/s: the most sent in any `window_s`, over the window

The counter is the engine's own (every datagram it wrote: data, repairs and ACKs, with their
headers), sampled every `every_s` seconds; the peak is the largest increase between two samples
`window_s` apart, over the time between them. A paced engine sends at its link's rate while a message is
in flight, so the peak falls below the link's rate only where the transfers of a window add up
to less than the window: choose `window_s` at the scale the question is about (a round interval,
a second).
"""
from __future__ import annotations

import threading
import time
from collections import deque

from p2plearn.protocols import DataChannel


class UplinkMeter:
    def __init__(self, channel: DataChannel, window_s: float = 1.0, every_s: float = 0.05):
        if not 0 < every_s <= window_s:
            raise ValueError(f"need 0 < every_s <= window_s, got every_s={every_s}, window_s={window_s}")
        self.channel, self.window_s, self.every_s = channel, window_s, every_s
        self.peak_bytes_per_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="p2plearn-uplink-meter", daemon=True)
        self._thread.start()

    def _sent(self) -> int:
        return int(self.channel.stats().get("bytes_sent", 0))

    def _run(self) -> None:
        samples: deque[tuple[float, int]] = deque()  # (time, bytes sent), the last window's
        while not self._stop.wait(self.every_s):
            now, sent = time.monotonic(), self._sent()
            samples.append((now, sent))
            while now - samples[0][0] > self.window_s + self.every_s / 2:
                samples.popleft()
            start, before = samples[0]
            if now - start >= self.window_s - self.every_s / 2:  # a full window: no rate from a short one
                self.peak_bytes_per_s = max(self.peak_bytes_per_s, (sent - before) / (now - start))

    def stop(self) -> float:
        """Stop sampling; the peak in bytes per second (0 when training was shorter than a window)."""
        self._stop.set()
        self._thread.join()
        return self.peak_bytes_per_s
