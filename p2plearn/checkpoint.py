"""Checkpoints of a job: every rank saves its own, and a job resumes from a step all ranks saved.

    start = p2plearn.checkpoint.load("ckpt", model, opt, scheduler=sched, scaler=scaler) or {}
    for epoch in range(start.get("epoch", 0), epochs):
        ...                                               # train one epoch
        p2plearn.checkpoint.save("ckpt", model, opt, scheduler=sched, scaler=scaler, epoch=epoch + 1)

Layout: ``DIR/step-<S>/rank-<r>.pt``, S being the optimizer's local steps taken (several may fall
in one round with ``--period``), each file written to a temporary name and renamed, so a file that
exists is whole. A step is complete when every rank of the job has its file there; `load` takes
the newest complete step, so a job stopped while some ranks had saved step S and others not
resumes from the step before. After saving, a rank removes its own files of steps older than the
newest complete one (never that one). A newer step that only some ranks saved is named when it is
skipped (``p2plearn: ckpt/step-S was saved by ranks 0, 1 of 4 only ...``), as p2plearn-run does.

Resuming and starting afresh, with the loop above (under any launcher)::

    p2plearn-run -np 4 -- python train.py                  # resumes from ckpt/ if it holds a complete step
    rm -rf ckpt && p2plearn-run -np 4 -- python train.py   # starts afresh (or save to another directory)

On resuming, rank 0 prints ``p2plearn: resuming from ckpt/step-S (epoch=E)``. A rerun of a job
that had finished resumes from its last checkpoint and trains no step: when the optimizer of a
job closes right after its last save, rank 0 marks that step as where the job ended (``DIR/step-S/end``:
the command and its script's digest), so a rerun of the same command (same script, same arguments)
says ``p2plearn: nothing left to train: the checkpoint at step S is the end`` as it resumes, before
anything the script prints after its loop; a changed command resumes without that word, and says it
when the optimizer closes having trained no step. ``p2plearn-run --resume`` names such a step
before starting the ranks; it cannot know how far the script trains, so the ranks start all the
same (with their loop done, they go straight to what follows it).
A script that calls ``load(None, ...)`` resumes only when launched with ``p2plearn-run --resume
DIR``, which checks DIR has a complete step saved by a job of this size before anything starts
(`resumable`) and sets ``P2PLEARN_RESUME=DIR``. A script that never calls `load` trains from
scratch; rank 0 says so when its runtime closes.

`load` refuses a file it cannot resume from with one `CheckpointError` line naming the file and
what is wrong (uncaught, that line alone ends the process, exit code 2: ``p2plearn.rendezvous.errors``):
empty, truncated or not a checkpoint; saved by a job of another size; not fitting the model or optimizer; NaN or inf in the model or optimizer state (``allow_nonfinite=True``
loads those anyway: a job that diverged resumes diverged).

What a checkpoint holds, per rank: the model's state dict, the optimizer's (the wrapped
optimizer's state plus p2plearn's step and round clocks, outer momentum, filter residuals and
policy state), torch's RNG
state, the state dict of every other object passed by keyword (scheduler, GradScaler, ...), and
any plain value passed by keyword (an epoch number). Files load with ``weights_only=True``.

Resuming is exact: under BSP with exact delivery and fixed seeds, a job stopped after a checkpoint
and resumed from it ends with the same parameters, bit for bit, as one that never stopped (the
data order must be a function of the epoch, as ``p2plearn.data.shard`` is). A peer that joined a
running job (its optimizer's ``joined``) keeps the model and clock it took from the others and
loads only its optimizer's own state and the other objects.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from .rendezvous.errors import SetupError
from .rendezvous.variables import RESUME_VAR

_STEP = re.compile(r"step-(\d+)$")
_RANK = re.compile(r"rank-(\d+)\.pt$")
_SAVED = ("model", "optimizer", "rng", "world_size")  # what every checkpoint file holds
_RESERVED = (*_SAVED, "allow_nonfinite")
END_FILE = "end"  # in a step's folder: the job that saved it ended there (see the module's docstring)


class CheckpointError(SetupError):
    """A checkpoint directory that cannot be resumed from (which, and why)."""


def steps(directory: str | os.PathLike) -> dict[int, set[int]]:
    """The steps saved under ``directory`` and, for each, the ranks whose file is there."""
    found: dict[int, set[int]] = {}
    root = Path(directory)
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        if (m := _STEP.match(entry.name)) and entry.is_dir():
            try:
                found[int(m.group(1))] = {int(r.group(1)) for f in entry.iterdir() if (r := _RANK.match(f.name))}
            except FileNotFoundError:
                pass  # another rank's pruning removed the emptied folder since the listing above
    return found


def newest_complete(directory: str | os.PathLike, world_size: int) -> int | None:
    """The newest step every rank 0..world_size-1 saved, or None."""
    complete = [s for s, ranks in steps(directory).items() if ranks >= set(range(world_size))]
    return max(complete, default=None)


def describe(directory: str | os.PathLike, world_size: int) -> str:
    """Why ``directory`` has no complete step, in one line (for error messages)."""
    found = steps(directory)
    if not found:
        return f"{directory} holds no checkpoint (no step-*/rank-*.pt)"
    newest = max(found)
    missing = sorted(set(range(world_size)) - found[newest])
    return (f"no step in {directory} was saved by all {world_size} ranks (newest: step {newest}, "
            f"missing ranks {', '.join(map(str, missing))})")


def resumable(directory: str | os.PathLike, world_size: int) -> int:
    """The step a job of ``world_size`` ranks resumes from in ``directory`` (the newest complete
    one), or `CheckpointError` saying why there is none: no complete step, or a newest complete
    step saved by a job of more ranks (its files say so without being read)."""
    found = steps(directory)
    newest = newest_complete(directory, world_size)
    if newest is None:
        raise CheckpointError(describe(directory, world_size))
    if max(found[newest]) >= world_size:
        saved = max(found[newest]) + 1
        raise CheckpointError(f"{Path(directory) / f'step-{newest}'} was saved by a job of {saved} ranks, this one "
                              f"has {world_size} (run {saved} ranks, or resume from a checkpoint of {world_size})")
    return newest


def skipped(directory: str | os.PathLike, world_size: int, newest: int) -> str | None:
    """One line naming the steps newer than ``newest`` that only some ranks saved (a job stopped
    while saving), which resuming from ``newest`` skips; None when there are none."""
    partial = {step: ranks for step, ranks in steps(directory).items() if step > newest}
    if not partial:
        return None
    step = max(partial)
    ranks = ", ".join(map(str, sorted(partial[step])))
    more = f" (and {len(partial) - 1} older partial steps)" if len(partial) > 1 else ""
    return (f"{Path(directory) / f'step-{step}'} was saved by ranks {ranks} of {world_size} only{more} (a job "
            f"stopped while saving): skipped, resuming from step {newest}")


def ended(directory: str | os.PathLike, step: int) -> dict[str, Any] | None:
    """What ``DIR/step-S/end`` says (the command whose job ended at ``step``), or None: not marked."""
    try:
        return json.loads((Path(directory) / f"step-{step}" / END_FILE).read_text())
    except (OSError, ValueError):
        return None  # unmarked, or a marker half-written by a job killed meanwhile: as unmarked


def this_command() -> dict[str, Any]:
    """This process's command as an end marker holds it: the script's path and digest, its arguments."""
    script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    try:
        digest = hashlib.sha256(Path(script).read_bytes()).hexdigest()
    except OSError:
        digest = None  # python -c, an interactive session: no file to compare
    return {"script": script, "sha256": digest, "args": sys.argv[1:]}


def closing(optimizer: Any) -> None:
    """At the optimizer's close: rank 0 says when this job trained nothing past the step it resumed
    from (or, when `load` said so already and the script trained on after all, that it did), and marks
    its last saved step as where the job ended when no step was taken after it."""
    runtime = optimizer.runtime
    if runtime.rank != 0:
        return
    resumed = optimizer.resumed_step
    if resumed is not None and resumed == optimizer.steps and not runtime.said_nothing_left:
        print(f"p2plearn: nothing left to train: the checkpoint at step {resumed} is the end", flush=True)
    elif runtime.said_nothing_left and optimizer.steps != resumed:
        print(f"p2plearn: trained on past step {resumed} after all (to step {optimizer.steps}): what ends this "
              f"script's loop is not in its command alone", flush=True)
    if runtime.saved is not None and runtime.saved[1] == optimizer.steps:
        folder = Path(runtime.saved[0]) / f"step-{optimizer.steps}"
        tmp = folder / f".{END_FILE}.tmp"
        tmp.write_text(json.dumps(this_command()))
        os.replace(tmp, folder / END_FILE)


def save(directory: str | os.PathLike, model: Any, optimizer: Any, /, **objects: Any) -> Path:
    """Save this rank's checkpoint for the optimizer's current step; returns the file's path.
    Call it on every rank at the same point (e.g. the end of an epoch). ``objects``: anything
    with a ``state_dict()`` (scheduler, GradScaler), or a plain value (an epoch number)."""
    import torch

    clash = [name for name in objects if name in _RESERVED]
    if clash:
        raise ValueError(f"{', '.join(clash)}: reserved names in a checkpoint; pass them under another name")
    runtime = optimizer.runtime
    folder = Path(directory) / f"step-{optimizer.steps}"
    folder.mkdir(parents=True, exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
             "world_size": runtime.world_size}
    for name, obj in objects.items():
        state[name] = obj.state_dict() if hasattr(obj, "state_dict") else obj
    path = folder / f"rank-{runtime.rank}.pt"
    tmp = folder / f".rank-{runtime.rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a file that exists is whole
    runtime.saved = (os.fspath(directory), optimizer.steps)
    _prune(Path(directory), runtime.rank, runtime.world_size)
    return path


def load(directory: str | os.PathLike | None, model: Any, optimizer: Any, /, *, allow_nonfinite: bool = False,
         **objects: Any) -> dict[str, Any] | None:
    """Restore this rank from the newest step every rank saved under ``directory`` (None:
    ``$P2PLEARN_RESUME``, set by ``p2plearn-run --resume``). Returns the plain values saved
    with it (e.g. ``{"epoch": 3}``), or None when there is nothing to resume from (no directory,
    or no complete step in it: a fresh start). ``objects`` are loaded from their state dicts.

    Rank 0 prints the step it resumes from. A file that cannot be resumed from (unreadable,
    truncated, not a checkpoint, saved for another model or job size, or holding NaN/inf in the
    model or optimizer state) raises `CheckpointError` naming the file and what is wrong; all but
    a misfit of the model or optimizer are found before anything is restored.
    ``allow_nonfinite=True`` loads NaN/inf values all the same."""
    import torch

    required = directory is None  # --resume promised a complete step
    directory = os.environ.get(RESUME_VAR) if directory is None else directory
    if not directory:
        return None
    runtime = optimizer.runtime
    newest = newest_complete(directory, runtime.world_size)
    if newest is None:
        if required:
            raise CheckpointError(describe(directory, runtime.world_size))
        return None
    if runtime.rank == 0 and (partial := skipped(directory, runtime.world_size, newest)):
        print(f"p2plearn: {partial}", flush=True)
    folder = Path(directory) / f"step-{newest}"
    path = folder / f"rank-{runtime.rank}.pt"
    state = _read(path)
    absent = [name for name in objects if name not in state]
    if absent:
        raise CheckpointError(f"{path}: holds no {', '.join(absent)} (saved: "
                              f"{', '.join(k for k in state if k not in _RESERVED) or 'nothing else'})")
    if state["world_size"] != runtime.world_size:
        raise CheckpointError(f"{path}: saved by a job of {state['world_size']} ranks, this one has "
                              f"{runtime.world_size}")
    if not allow_nonfinite:
        for part in ("model", "optimizer"):
            where = _nonfinite(state[part])
            if where:
                raise CheckpointError(f"{path}: the {part} state holds NaN or inf (in {where}); training from it "
                                      f"goes nowhere (load(..., allow_nonfinite=True) loads it anyway)")
    try:
        if not optimizer.joined:  # a joiner's model and clock are the running job's, newer than any file
            model.load_state_dict(state["model"])
            torch.set_rng_state(state["rng"])
        optimizer.load_state_dict(state["optimizer"])
        plain = {}
        for name, value in state.items():
            if name in _RESERVED:
                continue
            if name in objects:
                objects[name].load_state_dict(value)
            else:
                plain[name] = value
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as error:
        raise CheckpointError(f"{path}: does not fit what it is loaded into ({_one_line(error)})") from error
    if not optimizer.joined:
        optimizer.resumed_step = newest  # close() says when the job had nothing left to train
    runtime.resumed_step = newest  # its close() says when p2plearn-run --resume was never loaded
    if runtime.rank == 0:
        values = ", ".join(f"{name}={value}" for name, value in plain.items())
        print(f"p2plearn: resuming from {folder}" + (f" ({values})" if values else ""), flush=True)
        if not optimizer.joined and ended(directory, newest) == this_command():
            print(f"p2plearn: nothing left to train: the checkpoint at step {newest} is the end", flush=True)
            runtime.said_nothing_left = True
    return plain


def _read(path: Path) -> dict[str, Any]:
    """The checkpoint file at ``path``, or `CheckpointError` saying why it is not one."""
    import torch

    try:
        state = torch.load(path, weights_only=True)
    except Exception as error:  # torch.load's failures on bad bytes are of many kinds (EOF, zip, unpickling)
        size = path.stat().st_size if path.is_file() else 0
        why = "empty file" if size == 0 else f"{size} bytes, {_one_line(error)}"
        raise CheckpointError(f"{path}: not a readable checkpoint ({why})") from error
    missing = [name for name in _SAVED if not isinstance(state, dict) or name not in state]
    if missing:
        raise CheckpointError(f"{path}: not a p2plearn checkpoint (it holds no {', '.join(missing)})")
    return state


def _nonfinite(value: Any, where: str = "") -> str | None:
    """The name of the first floating tensor in a (nested) state that holds NaN or inf. Plain
    numbers are not looked at: histories (losses, update norms) may rightly hold an inf."""
    import torch

    if isinstance(value, torch.Tensor):
        if not value.is_floating_point() or value.numel() == 0:
            return None
        low, high = torch.aminmax(value)  # NaN propagates to both; no mask of the tensor's size (10x faster)
        return None if bool(torch.isfinite(low) & torch.isfinite(high)) else where
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = _nonfinite(item, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def _one_line(error: BaseException, limit: int = 300) -> str:
    """``error`` as one line of at most ``limit`` characters (torch's messages span several)."""
    text = f"{type(error).__name__}: {' '.join(str(error).split())}".rstrip(": ")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _prune(root: Path, rank: int, world_size: int) -> None:
    """Remove this rank's files of steps older than the newest complete one, and emptied folders."""
    newest = newest_complete(root, world_size)
    if newest is None:
        return
    for step in steps(root):
        if step < newest:
            folder = root / f"step-{step}"
            (folder / f"rank-{rank}.pt").unlink(missing_ok=True)
            (folder / END_FILE).unlink(missing_ok=True)  # the job went on past that end
            try:
                folder.rmdir()  # the last rank to prune removes the folder
            except OSError:
                pass
