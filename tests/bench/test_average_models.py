"""The large-model bench row's pieces: GPT-2 small's tensor shapes, gloo's DDP-like buckets, and (slow)
a p2plearn peer job of the round benchmark writing its round times, CPU seconds and peak RSS."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from p2plearn.bench.average import BUCKET_MB, bucket_sizes
from p2plearn.bench.models import gpt2_small_shapes, model_bytes, model_shapes


def test_gpt2_small_has_its_148_tensors_and_124m_parameters():
    shapes = gpt2_small_shapes()
    assert len(shapes) == 148
    assert shapes["wte.weight"] == (50257, 768) and shapes["wpe.weight"] == (1024, 768)
    assert shapes["h.11.attn.c_attn.weight"] == (768, 2304) and shapes["h.0.mlp.c_proj.weight"] == (3072, 768)
    assert sum(math.prod(s) for s in shapes.values()) == 124_439_808  # GPT-2 small, head tied to wte
    assert model_bytes("gpt2-small") == 4 * 124_439_808
    assert model_shapes("flat", megabytes=10) == {"w": (10 * 2**20 // 4,)} and model_bytes("flat", 10) == 10 * 2**20
    with pytest.raises(ValueError, match="unknown model"):
        model_shapes("gpt5")


@pytest.mark.parametrize("itemsize", [4, 2])
def test_gloo_buckets_hold_every_parameter_in_ddp_sized_buckets(itemsize):
    sizes = bucket_sizes(list(gpt2_small_shapes().values()), itemsize)
    assert sum(sizes) == 124_439_808
    assert [s for s in sizes if s * itemsize > BUCKET_MB * 2**20] == [50257 * 768]  # the embedding, alone
    assert len(sizes) <= 2 * (124_439_808 * itemsize // (BUCKET_MB * 2**20) + 1)  # packed, not one per tensor


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_round_peers_report_times_cpu_and_peak_rss(tmp_path):
    cmd = [sys.executable, "-m", "p2plearn.launch", "-np", "2", "--sync", "partitioned", "--period", "1", "--",
           sys.executable, "-m", "p2plearn.bench.rounds", "--peer", str(tmp_path), "1", "3", "flat"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        peer = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(peer["rounds"]) == 3 and all(r["comm_s"] > 0 and r["cpu_s"] > 0 for r in peer["rounds"])
        assert 50 < peer["peak_rss_mb"] < 5000
