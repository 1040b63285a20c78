"""One rank of a test job (started by ``job.run_job``): ``peer.py SCENARIO RESULT_JSON``. The default
group is the p2plearn backend; a gloo group over the same ranks computes every reference result, on
the CPU. ``P2PLEARN_TEST_DEVICE=cuda`` puts the p2plearn side's tensors and models on the GPU."""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import p2plearn  # noqa: F401  (registers the backend: torch was imported first)
import p2plearn.ddp


DEVICE = os.environ.get("P2PLEARN_TEST_DEVICE", "cpu")
TOLERANCE = 1e-6 if DEVICE == "cpu" else 1e-4  # a GPU's float32 kernels round otherwise than the CPU's


def on(t: torch.Tensor) -> torch.Tensor:
    """``t`` where the p2plearn side's tensors live (a copy unless that is the CPU)."""
    return t.to(DEVICE)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to float rounding (the all-reduce averages, then scales; gloo sums)."""
    return a.shape == b.shape and torch.allclose(a.cpu(), b.cpu(), rtol=10 * TOLERANCE, atol=TOLERANCE)


def equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.cpu(), b.cpu())


def close_bf16(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    """bfloat16 results within one rounding (8 bits of mantissa) of float32 reference values."""
    return torch.allclose(ours.cpu().float(), ref.float(), rtol=2 ** -8, atol=1e-6)


def collectives(rank: int, n: int, gloo: dist.ProcessGroup) -> dict:
    out = {}
    g = torch.Generator().manual_seed(rank)
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
        x = torch.randn(3000, generator=g)
        ours = on(x)
        if op == dist.ReduceOp.AVG:  # gloo has no AVG: its reference is the sum over n
            ref = x.clone()
            dist.all_reduce(ref, group=gloo)
            ref /= n
        else:
            ref = x.clone()
            dist.all_reduce(ref, op=op, group=gloo)
        dist.all_reduce(ours, op=op)
        out[f"allreduce_{name}"] = same(ours, ref)
    for name, op in (("sum", dist.ReduceOp.SUM), ("avg", dist.ReduceOp.AVG), ("max", dist.ReduceOp.MAX)):
        x = (torch.randn(3000, generator=g) * 3).bfloat16()
        wide = x.float()  # the reference: the values reduced in float32 (gloo's own adds round in bfloat16)
        dist.all_reduce(wide, op=dist.ReduceOp.SUM if op == dist.ReduceOp.AVG else op, group=gloo)
        ours = on(x)
        dist.all_reduce(ours, op=op)
        ref = wide / n if op == dist.ReduceOp.AVG else wide
        out[f"allreduce_bf16_{name}"] = ours.dtype == torch.bfloat16 and close_bf16(ours, ref)
    sent = []  # bytes this rank's engine sent for a float32 all-reduce, then a bfloat16 one
    for dtype in (torch.float32, torch.bfloat16):
        before = dist.distributed_c10d._get_default_group().stats()["engine"]["bytes_sent"]
        dist.all_reduce(on(torch.ones(1 << 18, dtype=dtype)))
        sent.append(dist.distributed_c10d._get_default_group().stats()["engine"]["bytes_sent"] - before)
    out["allreduce_bf16_wire"] = 0.3 < sent[1] / sent[0] < 0.7  # bfloat16 on the wire: half float32's bytes (widened: 1)
    x = (torch.randn(4 * n, generator=g) * 3).bfloat16()
    wide, ours = torch.zeros(4), on(torch.zeros(4, dtype=torch.bfloat16))
    dist.reduce_scatter_tensor(wide, x.float(), group=gloo)
    dist.reduce_scatter_tensor(ours, on(x))
    out["reduce_scatter_tensor_bf16"] = close_bf16(ours, wide)
    ints = torch.arange(10, dtype=torch.int64) * (rank + 1)
    ref, ours = ints.clone(), on(ints)
    dist.all_reduce(ref, group=gloo)
    dist.all_reduce(ours)
    out["allreduce_int"] = equal(ours, ref)
    for name, op in (("band", dist.ReduceOp.BAND), ("bor", dist.ReduceOp.BOR), ("bxor", dist.ReduceOp.BXOR)):
        bits = torch.randint(0, 256, (64,), generator=g, dtype=torch.int32)
        ref, ours = bits.clone(), on(bits)
        dist.all_reduce(ref, op=op, group=gloo)
        dist.all_reduce(ours, op=op)
        out[f"allreduce_{name}"] = equal(ours, ref)
    try:  # as gloo: raised at the call, and the group goes on
        dist.all_reduce(on(torch.ones(4)), op=dist.ReduceOp.BAND)
        out["bitwise_float_refused"] = False
    except RuntimeError as exc:
        out["bitwise_float_refused"] = "non-integral" in str(exc)
    strided = torch.randn(40, 30, generator=g)
    ref, ours = strided.t().clone(), on(strided).t()  # not contiguous
    dist.all_reduce(ref, group=gloo)
    dist.all_reduce(ours)
    out["allreduce_strided"] = same(ours, ref)
    x = torch.randn(77, generator=g)
    ref, ours = x.clone(), on(x)
    dist.broadcast(ours, src=n - 1)
    dist.broadcast(ref, src=n - 1, group=gloo)
    out["broadcast"] = equal(ours, ref)
    mine = torch.randn(5, generator=g)
    got, ref = [on(torch.zeros(5)) for _ in range(n)], [torch.zeros(5) for _ in range(n)]
    dist.all_gather(got, on(mine))
    dist.all_gather(ref, mine, group=gloo)
    out["all_gather"] = all(equal(a, b) for a, b in zip(got, ref))
    flat, flat_ref = on(torch.zeros(5 * n)), torch.zeros(5 * n)
    dist.all_gather_into_tensor(flat, on(mine))
    dist.all_gather_into_tensor(flat_ref, mine, group=gloo)
    out["all_gather_into_tensor"] = equal(flat, flat_ref)
    inputs = [torch.randn(4, generator=g) for _ in range(n)]
    got, ref = on(torch.zeros(4)), torch.zeros(4)
    dist.reduce_scatter(got, [on(i) for i in inputs])
    dist.reduce_scatter(ref, inputs, group=gloo)
    out["reduce_scatter"] = same(got, ref)
    got, ref = on(torch.zeros(4)), torch.zeros(4)
    dist.reduce_scatter_tensor(got, on(torch.cat(inputs)))
    dist.reduce_scatter_tensor(ref, torch.cat(inputs), group=gloo)
    out["reduce_scatter_tensor"] = same(got, ref)
    for name, op, x in (("sum", dist.ReduceOp.SUM, torch.randn(3000, generator=g)),
                        ("max", dist.ReduceOp.MAX, torch.randn(3000, generator=g)),
                        ("int", dist.ReduceOp.SUM, torch.arange(10) * (rank + 1))):
        ref, ours = x.clone(), on(x)
        dist.all_reduce(ref, op=op, group=gloo)  # the root's reference (gloo's other ranks keep scratch)
        dist.reduce(ours, dst=1, op=op)
        out[f"reduce_{name}"] = same(ours, ref) if rank == 1 else equal(ours, x)  # the others' left as they were
    x = (torch.randn(300, generator=g) * 3).bfloat16()
    wide, ours = x.float(), on(x)
    dist.all_reduce(wide, group=gloo)
    dist.reduce(ours, dst=0)
    out["reduce_bf16"] = close_bf16(ours, wide) if rank == 0 else equal(ours, x)
    rows = torch.randn(2 * n, 3, generator=g)
    got, ref = on(torch.zeros(2 * n, 3)), torch.zeros(2 * n, 3)
    dist.all_to_all_single(got, on(rows))
    dist.all_to_all_single(ref, rows, group=gloo)
    out["all_to_all_single"] = equal(got, ref)
    sends = [(rank + r) % 3 for r in range(n)]  # rows for rank r, zero for some pairs
    receives = [(s + rank) % 3 for s in range(n)]
    rows = torch.randn(sum(sends), 2, generator=g)
    got, ref = on(torch.zeros(sum(receives), 2)), torch.zeros(sum(receives), 2)
    dist.all_to_all_single(got, on(rows), receives, sends)
    dist.all_to_all_single(ref, rows, receives, sends, group=gloo)
    out["all_to_all_single_uneven"] = equal(got, ref)
    pieces = [torch.randn(2, generator=g) for _ in range(n)]  # (gloo's must be of one size)
    got, ref = [on(torch.zeros(2)) for _ in range(n)], [torch.zeros(2) for _ in range(n)]
    dist.all_to_all(got, [on(p) for p in pieces])
    dist.all_to_all(ref, pieces, group=gloo)
    out["all_to_all"] = all(equal(a, b) for a, b in zip(got, ref))
    try:  # as gloo: raised at the call, and the group goes on
        dist.all_to_all_single(on(torch.zeros(n)), on(torch.zeros(n)), [n + 1] + [0] * (n - 1), [1] * n)
        out["bad_splits_refused"] = False
    except (ValueError, RuntimeError) as exc:
        out["bad_splits_refused"] = "split" in str(exc)
    tensors = [torch.randn(7, generator=g), torch.randn(3, generator=g)]
    ours, refs = [on(t) for t in tensors], [t.clone() for t in tensors]
    for group, outputs in ((None, ours), (gloo, refs)):  # what FSDP and DTensor batch
        with dist._coalescing_manager(group, async_ops=True) as batch:
            for t in outputs:
                dist.all_reduce(t, group=group)
        batch.wait()
    out["all_reduce_coalesced"] = all(same(a, b) for a, b in zip(ours, refs))
    ours, refs = [on(torch.zeros(2 * n)), on(torch.zeros(3 * n))], [torch.zeros(2 * n), torch.zeros(3 * n)]
    for group, outputs, device in ((None, ours, DEVICE), (gloo, refs, "cpu")):
        with dist._coalescing_manager(group, async_ops=True) as batch:
            for o, t in zip(outputs, tensors):
                dist.all_gather_into_tensor(o, t[:o.numel() // n].to(device), group=group)
        batch.wait()
    out["all_gather_into_tensor_coalesced"] = all(equal(a, b) for a, b in zip(ours, refs))
    ours, refs = [on(torch.zeros(2)), on(torch.zeros(1))], [torch.zeros(2), torch.zeros(1)]
    for group, outputs, device in ((None, ours, DEVICE), (gloo, refs, "cpu")):
        with dist._coalescing_manager(group, async_ops=True) as batch:
            for o, t in zip(outputs, tensors):
                dist.reduce_scatter_tensor(o, t[:o.numel() * n].to(device), group=group)
        batch.wait()
    out["reduce_scatter_tensor_coalesced"] = all(same(a, b) for a, b in zip(ours, refs))
    gathered = [on(torch.zeros(5)) for _ in range(n)] if rank == 0 else None
    dist.gather(on(mine), gathered, dst=0)
    everyone = [torch.zeros(5) for _ in range(n)]
    dist.all_gather(everyone, mine, group=gloo)
    out["gather"] = rank != 0 or all(equal(a, b) for a, b in zip(gathered, everyone))
    piece = on(torch.zeros(3))
    dist.scatter(piece, [on(torch.full((3,), float(r))) for r in range(n)] if rank == 0 else None, src=0)
    out["scatter"] = equal(piece, torch.full((3,), float(rank)))
    objects = [None] * n
    dist.all_gather_object(objects, {"rank": rank, "text": "x" * rank})
    out["all_gather_object"] = objects == [{"rank": r, "text": "x" * r} for r in range(n)]
    box = [{"from": "root"}] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    out["broadcast_object_list"] = box == [{"from": "root"}]
    dist.barrier()
    out["barrier"] = True
    work = dist.all_reduce(on(torch.ones(8)), async_op=True)
    work.wait()
    out["async_future"] = equal(work.get_future().wait()[0], torch.full((8,), float(n)))
    try:
        dist.recv(on(torch.zeros(n)))  # from any rank
        out["unsupported"] = "no error"
    except NotImplementedError as exc:
        out["unsupported"] = str(exc)
    return out


def point_to_point(rank: int, n: int, gloo: dist.ProcessGroup) -> dict:
    """Sends and receives over p2plearn against gloo's (3 ranks): a ring of isend/irecv and of
    batch_isend_irecv, several messages of one tag in order, two tags received in the other order,
    a receive posted long before its send and a send long before its receive, an int64 tensor."""
    out = {}
    right, left = (rank + 1) % n, (rank - 1) % n
    mine = torch.arange(6, dtype=torch.float32) + 10 * rank
    results = []
    for group, device in ((None, DEVICE), (gloo, "cpu")):
        got = torch.zeros(6, device=device)
        works = [dist.isend(mine.to(device), right, group=group), dist.irecv(got, left, group=group)]
        for w in works:
            w.wait()
        results.append(got)
    out["ring"] = equal(results[0], results[1]) and equal(results[1], torch.arange(6.0) + 10 * left)
    got = on(torch.zeros(6))
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, on(mine), right), dist.P2POp(dist.irecv, got, left)]):
        w.wait()
    out["batch_isend_irecv"] = equal(got, torch.arange(6.0) + 10 * left)
    if rank == 0:
        works = [dist.isend(on(torch.full((4,), float(i))), 1, tag=7) for i in range(3)]
        works += [dist.isend(on(torch.full((2,), 100.0)), 1, tag=1), dist.isend(on(torch.full((2,), 200.0)), 1, tag=2)]
        for w in works:
            w.wait()
    elif rank == 1:
        got = [on(torch.zeros(4)) for _ in range(3)]
        for g in got:
            dist.recv(g, 0, tag=7)
        out["in_order"] = all(equal(g, torch.full((4,), float(i))) for i, g in enumerate(got))
        second, first = on(torch.zeros(2)), on(torch.zeros(2))
        dist.recv(second, 0, tag=2)  # sent last, received first
        dist.recv(first, 0, tag=1)
        out["tags"] = equal(second, torch.full((2,), 200.0)) and equal(first, torch.full((2,), 100.0))
    if rank == 2:  # a receive posted 1 s before its send, then a send 1 s before its receive
        early = on(torch.zeros(3, dtype=torch.int64))
        work = dist.irecv(early, 0)
        work.wait()
        time.sleep(1.0)
        dist.send(on(torch.arange(3) * 7), 0)
        out["receive_first"] = equal(early, torch.arange(3) * 5)
    elif rank == 0:
        time.sleep(1.0)
        dist.send(on(torch.arange(3) * 5), 2)
        late = on(torch.zeros(3, dtype=torch.int64))
        dist.recv(late, 2)
        out["send_first"] = equal(late, torch.arange(3) * 7)
    dist.barrier()
    return out


def pipeline(rank: int, gloo: dist.ProcessGroup) -> dict:
    """A two-stage pipeline (torch.distributed.pipelining, GPipe over 4 micro-batches: its
    activations and gradients go by batch_isend_irecv) over p2plearn and over gloo, from the same
    start: the same losses, and the same parameters after 4 steps."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    out = {}
    for name, group in (("p2plearn", None), ("gloo", gloo)):
        layers = list(model(seed=0))
        stage_module = torch.nn.Sequential(*(layers[:3] if rank == 0 else layers[3:]))
        stage = PipelineStage(stage_module, rank, 2, torch.device("cpu"), group=group)
        schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=torch.nn.functional.cross_entropy)
        opt = torch.optim.SGD(stage_module.parameters(), lr=0.05)
        g = torch.Generator().manual_seed(100)
        losses = []
        for _ in range(4):
            x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
            opt.zero_grad()
            if rank == 0:
                schedule.step(x)
            else:
                step_losses = []
                schedule.step(target=y, losses=step_losses)
                losses.append(torch.stack(step_losses).mean())
            opt.step()
        out[name] = (losses, [p.detach().clone() for p in stage_module.parameters()])
    ours, theirs = out["p2plearn"], out["gloo"]
    return {"losses_equal": len(ours[0]) == (4 if rank == 1 else 0) and all(
                same(a, b) for a, b in zip(ours[0], theirs[0])),
            "trained_equal": all(same(a, b) for a, b in zip(ours[1], theirs[1]))}


def subgroups(rank: int, n: int) -> dict:
    """Subgroups over p2plearn against the same subgroups over gloo (4 ranks): pairs, an
    overlapping triple, new_subgroups, DDP replicas in pairs, a 2-d DeviceMesh; a subgroup
    destroyed while the world goes on."""
    out = {}
    g = torch.Generator().manual_seed(rank)
    pairs = [(dist.new_group([0, 1]), dist.new_group([0, 1], backend="gloo")),
             (dist.new_group([2, 3]), dist.new_group([2, 3], backend="gloo"))]
    ours, theirs = pairs[rank // 2]
    out["pair_group"] = dist.get_backend(ours) == "p2plearn" and ours.rank() == rank % 2 and ours.size() == 2
    x = torch.randn(1000, generator=g)
    mine, ref = on(x), x.clone()
    dist.all_reduce(mine, group=ours)
    dist.all_reduce(ref, group=theirs)
    out["pair_all_reduce"] = same(mine, ref)
    src = 2 * (rank // 2) + 1  # a global rank, as torch takes it
    mine, ref = on(x), x.clone()
    dist.broadcast(mine, src=src, group=ours)
    dist.broadcast(ref, src=src, group=theirs)
    out["pair_broadcast"] = equal(mine, ref)
    partner = rank ^ 1  # global ranks, as torch takes them
    got = on(torch.zeros(5))
    for w in (dist.isend(on(x[:5]), partner, group=ours), dist.irecv(got, partner, group=ours)):
        w.wait()
    ref = torch.zeros(5)
    for w in (dist.isend(x[:5], partner, group=theirs), dist.irecv(ref, partner, group=theirs)):
        w.wait()
    out["pair_send_recv"] = equal(got, ref)
    triple = (dist.new_group([1, 2, 3]), dist.new_group([1, 2, 3], backend="gloo"))  # overlaps both pairs
    if rank > 0:
        got, ref = [on(torch.zeros(4)) for _ in range(3)], [torch.zeros(4) for _ in range(3)]
        dist.all_gather(got, on(x[:4]), group=triple[0])
        dist.all_gather(ref, x[:4], group=triple[1])
        out["triple_all_gather"] = all(equal(a, b) for a, b in zip(got, ref))
    world = x[:10].clone()
    dist.all_reduce(world)  # the world's group, between the subgroups' collectives
    ref = x[:10].clone()
    dist.all_reduce(ref, group=dist.new_group(backend="gloo"))
    out["world_between"] = same(world, ref)
    current, _ = dist.new_subgroups(group_size=2)
    current_gloo, _ = dist.new_subgroups(group_size=2, backend="gloo")
    mine, ref = on(x), x.clone()
    dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=current)
    dist.all_reduce(ref, op=dist.ReduceOp.MAX, group=current_gloo)
    out["new_subgroups"] = equal(mine, ref)
    replica = DDP(model(seed=rank).to(DEVICE), process_group=ours)  # two replicas of two ranks each
    reference = DDP(model(seed=rank), process_group=theirs)
    train(replica, rank)
    train(reference, rank)
    out["pair_ddp"] = all(same(a, b) for a, b in zip(replica.parameters(), reference.parameters()))
    hooked = DDP(model(seed=rank).to(DEVICE), process_group=ours)  # the hook, exact, on the pair's group
    hooked.register_comm_hook(p2plearn.ddp.LossTolerantState("fixed", process_group=ours),
                              p2plearn.ddp.loss_tolerant_hook)
    train(hooked, rank)
    out["pair_ddp_hook"] = all(same(a, b) for a, b in zip(hooked.parameters(), reference.parameters()))
    other = DDP(model(seed=rank ^ 2), process_group=theirs)  # the other pair's replica differs from ours
    train(other, rank ^ 2)
    out["replicas_differ"] = not all(same(a, b) for a, b in zip(reference.parameters(), other.parameters()))
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    for d, dim in enumerate(("replicate", "shard")):
        group = mesh.get_group(dim)
        members = [ranks.tolist() for ranks in mesh.mesh.transpose(0, d).reshape(2, -1).t()]  # the dim's groups
        references = [dist.new_group(m, backend="gloo") for m in members]  # every rank makes each, in order
        mine_at = next(i for i, m in enumerate(members) if rank in m)
        mine, ref = on(x[:8]), x[:8].clone()
        dist.all_reduce(mine, group=group)
        dist.all_reduce(ref, group=references[mine_at])
        out[f"mesh_{dim}"] = (dist.get_backend(group) == "p2plearn" and same(mine, ref)
                              and dist.get_process_group_ranks(group) == members[mine_at])
    dist.destroy_process_group(ours)
    after = on(torch.ones(3))
    dist.all_reduce(after)
    out["world_after_destroyed_subgroup"] = equal(after, torch.full((3,), float(n)))
    return out


def model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 4))


def train(ddp: torch.nn.Module, rank: int, steps: int = 6, optimizer: torch.optim.Optimizer | None = None) -> None:
    opt = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    device = next(ddp.parameters()).device
    for _ in range(steps):
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x.to(device)), y.to(device)).backward()
        opt.step()


def ddp(rank: int, n: int, gloo: dist.ProcessGroup, hook: bool, hadamard: bool = False, steps: int = 6) -> dict:
    """DDP over p2plearn (with the hook in exact mode, with or without the Hadamard transform, or
    without the hook) and over gloo, from the same rank-dependent start (DDP's construction
    broadcasts rank 0's): the same parameters after training."""
    ours = DDP(model(seed=rank).to(DEVICE), bucket_cap_mb=0.01)  # several buckets, overlapped with backward
    if hook:
        state = p2plearn.ddp.LossTolerantState("fixed", model=ours.module, hadamard=hadamard)
        ours.register_comm_hook(state, p2plearn.ddp.loss_tolerant_hook)
    theirs = DDP(model(seed=rank), bucket_cap_mb=0.01, process_group=gloo)
    start_equal = all(equal(a, b) for a, b in zip(ours.parameters(), theirs.parameters()))
    train(ours, rank, steps)
    train(theirs, rank, steps)
    out = {"start_equal": start_equal,
           "trained_equal": all(same(a, b) for a, b in zip(ours.parameters(), theirs.parameters())),
           "moved": any(not equal(a, b) for a, b in zip(ours.parameters(), model(seed=0).parameters()))}
    if hook:
        out["buckets"] = len(state.buckets)
        out["delivered"] = min(r.delivered for r in state.records())
    return out


def fsdp(rank: int, gloo: dist.ProcessGroup) -> dict:
    """FSDP over p2plearn and over gloo (CPU), from the same start: the same full parameters after
    training. FSDP frees a gathered parameter by resizing its storage to 0 after each use."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    full = []
    for group in (None, gloo):
        sharded = FSDP(model(seed=0), process_group=group, device_id=torch.device("cpu"))
        train(sharded, rank, steps=4, optimizer=torch.optim.SGD(sharded.parameters(), lr=0.05))
        with FSDP.summon_full_params(sharded):
            full.append([p.detach().clone() for p in sharded.parameters()])
    return {"trained_equal": all(same(a, b) for a, b in zip(*full))}


def fsdp2(rank: int, gloo: dist.ProcessGroup) -> dict:
    """fully_shard (FSDP2) over p2plearn and over gloo (CPU meshes), from the same start: the same
    full parameters after training."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    full = []
    for group in (dist.group.WORLD, gloo):
        mesh = DeviceMesh.from_group(group, "cpu")
        sharded = model(seed=0)
        for layer in sharded:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        train(sharded, rank, steps=4, optimizer=torch.optim.SGD(sharded.parameters(), lr=0.05))
        full.append([p.full_tensor().detach().clone() for p in sharded.parameters()])
    return {"trained_equal": all(same(a, b) for a, b in zip(*full))}


def post_local_sgd(rank: int, n: int, gloo: dist.ProcessGroup) -> dict:
    """PostLocalSGDOptimizer (a PeriodicModelAverager every 2 steps after 2 warm-up steps), local
    models without DDP, over p2plearn and over gloo: the same parameters."""
    from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
    from torch.distributed.optim import PostLocalSGDOptimizer

    results = []
    for group in (None, gloo):
        net = model(seed=rank)
        averager = PeriodicModelAverager(period=2, warmup_steps=2, process_group=group)
        opt = PostLocalSGDOptimizer(torch.optim.SGD(net.parameters(), lr=0.05), averager)
        train(net, rank, steps=8, optimizer=opt)  # averaged after steps 3, 5, 7 (counting from 1): the 8th is local
        results.append(list(net.parameters()))
    everyone = [None] * n
    dist.all_gather_object(everyone, [p.detach() for p in results[0]])
    return {"equal_to_gloo": all(same(a, b) for a, b in zip(*results)),
            "ranks_differ": any(not torch.equal(a, b) for a, b in zip(everyone[0], everyone[-1]))}


def checkpoint(rank: int, directory: str) -> dict:
    """torch.distributed.checkpoint saves a DDP model's state dict through the backend and loads it
    back into a model that was changed since."""
    import torch.distributed.checkpoint as dcp

    net = DDP(model(seed=0))
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    dcp.save({"model": net.state_dict()}, checkpoint_id=directory)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(1.0)
    state = {"model": net.state_dict()}
    dcp.load(state, checkpoint_id=directory)
    net.load_state_dict(state["model"])
    return {"restored": all(torch.equal(v, net.state_dict()[k]) for k, v in saved.items())}


def failure(run) -> dict:
    """What a collective raised: its type's names, its message, how long it took (s)."""
    t0 = time.monotonic()
    try:
        run()
    except Exception as exc:  # noqa: BLE001 - the test judges it
        return {"raised": [c.__name__ for c in type(exc).__mro__], "message": str(exc), "seconds": time.monotonic() - t0}
    return {"raised": [], "message": "", "seconds": time.monotonic() - t0}


def mismatch(rank: int, group: dist.ProcessGroup | None) -> dict:
    """Rank 0 all-reduces 8 elements, rank 1 three (a bug in the user's script): asynchronously,
    then synchronously, then a well-formed all-reduce on the failed group."""
    out = {"async": failure(lambda: dist.all_reduce(torch.ones(8 if rank == 0 else 3), async_op=True, group=group).wait())}
    if group is None:  # (gloo aborts a rank at the first: the rest is p2plearn's)
        out["sync"] = failure(lambda: dist.all_reduce(torch.ones(8 if rank == 0 else 3)))
        work = dist.all_reduce(torch.ones(4), async_op=True)
        out["after"] = failure(work.wait)
        out["after_success"] = work.is_success()
    return out


def dead_rank(rank: int, gloo: dist.ProcessGroup) -> dict:
    """Rank 1 is killed after 5 all-reduces; rank 0 goes on calling them, over gloo and then over
    p2plearn (the group's default timeout: 30 minutes)."""
    for _ in range(5):
        dist.all_reduce(torch.ones(1000))
        dist.all_reduce(torch.ones(1000), group=gloo)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"gloo": failure(lambda: dist.all_reduce(torch.ones(1000), group=gloo)),
            "p2plearn": failure(lambda: dist.all_reduce(torch.ones(1000)))}


def dead_rank_subgroup(rank: int) -> dict:
    """As dead_rank, in a subgroup of the two ranks (an engine of its own) and one over gloo; then
    rank 0's world group, which runs no collective after its subgroup's failed."""
    ours, theirs = dist.new_group([0, 1]), dist.new_group([0, 1], backend="gloo")
    for _ in range(3):
        dist.all_reduce(torch.ones(1000), group=ours)
        dist.all_reduce(torch.ones(1000), group=theirs)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"gloo": failure(lambda: dist.all_reduce(torch.ones(1000), group=theirs)),
            "p2plearn": failure(lambda: dist.all_reduce(torch.ones(1000), group=ours)),
            "world_after": failure(lambda: dist.all_reduce(torch.ones(10)))}


def dead_rank_p2p(rank: int, gloo: dist.ProcessGroup) -> dict:
    """Ranks 0 and 1 exchange 3 messages each way over both backends; rank 1 is killed; rank 0's
    next receive from it, over gloo and over p2plearn."""
    for group in (gloo, None):
        for _ in range(3):
            got = torch.zeros(100)
            for w in (dist.isend(torch.ones(100), 1 - rank, group=group), dist.irecv(got, 1 - rank, group=group)):
                w.wait()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"gloo": failure(lambda: dist.recv(torch.zeros(100), 1, group=gloo)),
            "p2plearn": failure(lambda: dist.recv(torch.zeros(100), 1))}


def dead_rank_ddp(rank: int, gloo: dist.ProcessGroup) -> dict:
    """DDP over gloo, over p2plearn, and over p2plearn with the loss-tolerant hook; rank 1 is killed
    after 3 steps of each; rank 0's next backward in each (gloo's raises a RuntimeError)."""
    models = {"gloo": DDP(model(0), process_group=gloo), "p2plearn": DDP(model(0))}
    models["p2plearn_hook"] = DDP(model(0))
    state = p2plearn.ddp.LossTolerantState("fixed", model=models["p2plearn_hook"].module)
    models["p2plearn_hook"].register_comm_hook(state, p2plearn.ddp.loss_tolerant_hook)
    for ddp_model in models.values():
        train(ddp_model, rank, steps=3)
    dist.barrier(group=gloo)  # both ranks through their steps: the next one is the first to fail
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {name: failure(lambda m=ddp_model: train(m, rank, steps=1)) for name, ddp_model in models.items()}


def forged(rank: int, n: int, gloo: dist.ProcessGroup) -> dict:
    """DDP over p2plearn and over gloo while a member (a thread of rank 1's process, holding the
    job's key) sends rank 0 messages in rank 1's name: of other shapes for the collectives about
    to run, and 60 KB ones for collectives far ahead. Rank 0's memory and training are unharmed."""
    from p2plearn.distributed.collectives import AHEAD, PHASES
    from p2plearn.keys import data_key
    from p2plearn.transport import Channel

    group = dist.distributed_c10d._get_default_group()
    rss_before = _rss_mb()
    stop = threading.Event()
    sent = []

    def forge() -> None:
        runtime = group.runtime
        with Channel(sender_id=1, job_id=runtime.job_id, key=data_key(runtime.secret.value, runtime.job_id)) as ch:
            victim = (*group.collectives.sender.engines[0], 0.0)
            junk, wide = [np.full(7, 1e30, np.float32)], [np.zeros(15000, np.float32)]
            while not stop.is_set():
                seq = group._seq
                for msg_id in range(seq * PHASES, (seq + 3) * PHASES):
                    ch.send(msg_id, junk, [victim])
                for _ in range(100):  # each a new message: an engine drops a repeated id as stale
                    ch.send((seq + AHEAD + 1) * PHASES + len(sent), wide, [victim])
                    sent.append(wide[0].nbytes)
                time.sleep(0.02)

    forger = threading.Thread(target=forge, daemon=True)
    if rank == 1:
        forger.start()
    out = ddp(rank, n, gloo, hook=False, steps=40)
    stop.set()
    if rank == 1:
        forger.join()
    dist.barrier()
    out["stats"] = group.stats()
    out["rss_growth_mb"] = _rss_mb() - rss_before
    out["forged_mb"] = sum(sent) / 2**20
    return out


def linger(rank: int) -> dict:
    """Rank 1 destroys its group right after an all-reduce; rank 0 waits 1.5 s, then sends rank 1's
    engine a message (as a retransmission of a lost acknowledgement would reach it) and destroys its
    own: how that send ended and when each rank's destroy_process_group began and ended."""
    from p2plearn.keys import data_key
    from p2plearn.transport import Channel

    group = dist.distributed_c10d._get_default_group()
    dist.all_reduce(torch.ones(1000))
    out = {}
    if rank == 0:
        time.sleep(1.5)
        runtime = group.runtime
        with Channel(sender_id=0, job_id=runtime.job_id, key=data_key(runtime.secret.value, runtime.job_id)) as ch:
            sent = ch.send(1 << 30, [np.ones(1000, np.float32)], [(*group.collectives.sender.engines[1], 0.0)])
            stats = sent.wait(10.0)[0]
        out["probe"] = {"result": stats.result, "delivered": stats.delivered}
    out["destroy_began"] = time.monotonic()  # (CLOCK_MONOTONIC: one clock for both processes)
    dist.destroy_process_group()
    out["destroy_ended"] = time.monotonic()
    return out


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    scenario, result = sys.argv[1], sys.argv[2]
    dist.init_process_group("p2plearn")
    rank, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    out = {"backend": dist.get_backend()}
    if scenario == "collectives":
        out.update(collectives(rank, n, gloo))
    elif scenario in ("ddp", "ddp_hook", "ddp_hadamard"):
        out.update(ddp(rank, n, gloo, hook=scenario != "ddp", hadamard=scenario == "ddp_hadamard"))
    elif scenario == "point_to_point":
        out.update(point_to_point(rank, n, gloo))
    elif scenario == "pipeline":
        out.update(pipeline(rank, gloo))
    elif scenario == "subgroups":
        out.update(subgroups(rank, n))
    elif scenario == "fsdp":
        out.update(fsdp(rank, gloo))
    elif scenario == "fsdp2":
        out.update(fsdp2(rank, gloo))
    elif scenario == "post_local_sgd":
        out.update(post_local_sgd(rank, n, gloo))
    elif scenario == "mismatch":
        out["p2plearn"] = mismatch(rank, None)
        _write(result, out)  # gloo aborts a rank at its mismatch
        out["gloo"] = mismatch(rank, gloo)
    elif scenario == "dead_rank":
        out.update(dead_rank(rank, gloo))
    elif scenario == "dead_rank_subgroup":
        out.update(dead_rank_subgroup(rank))
    elif scenario == "dead_rank_p2p":
        out.update(dead_rank_p2p(rank, gloo))
    elif scenario == "dead_rank_ddp":
        out.update(dead_rank_ddp(rank, gloo))
    elif scenario == "forged":
        out.update(forged(rank, n, gloo))
    elif scenario == "checkpoint":
        out.update(checkpoint(rank, str(Path(result).parent / "checkpoint")))
    elif scenario == "links":  # what paces the world's collectives
        world = dist.distributed_c10d._get_default_group()
        out.update(uplink=world.links.uplink.tolist(), downlink=world.links.downlink.tolist())
    elif scenario == "linger":
        out.update(linger(rank))  # (it destroys the group itself)
        _write(result, out)
        return
    dist.destroy_process_group()
    _write(result, out)


def _write(result: str, out: dict) -> None:
    with open(result, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
