"""UplinkMeter: the peak of an engine's bytes sent per window, sampled from its real counter."""
from __future__ import annotations

import time

import numpy as np
import pytest

from p2plearn.transport.uplink import UplinkMeter


def test_the_peak_lies_between_the_transfer_average_and_all_bytes_in_one_window(channels):  # noqa: F811
    a, b = channels(sender_id=1, uplink_rate=4e6), channels()  # 2 MB at 4 MB/s: ~0.5 s, several windows
    meter = UplinkMeter(a, window_s=0.2, every_s=0.02)
    start = time.monotonic()
    (st,) = a.send(1, [np.zeros(2_000_000, np.uint8)], [b.address]).wait(60)
    elapsed = time.monotonic() - start
    peak = meter.stop()
    sent = a.stats()["bytes_sent"]
    assert st.result == "exact" and sent > 2_000_000
    # some window carried at least the average (half of it: the windows at the ends are partial),
    # and none more than everything sent
    assert sent / elapsed / 2 <= peak <= sent / (0.2 - 0.01)


def test_a_run_shorter_than_a_window_has_no_peak(channels):  # noqa: F811
    meter = UplinkMeter(channels(), window_s=10.0)
    assert meter.stop() == 0.0


def test_a_sampling_interval_beyond_the_window_is_refused(channels):  # noqa: F811
    with pytest.raises(ValueError, match="every_s <= window_s"):
        UplinkMeter(channels(), window_s=0.1, every_s=0.2)
