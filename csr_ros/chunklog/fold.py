"""From records back to a state, and from a capsule back to a loaded resource.

`rebuild_state` folds records (a whole log, or a checkpoint and what follows it) into an empty
state; `resume` makes a resource hold that state, restoring a capsule saved at a committed
boundary where it can and prefilling only what came after it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from csr_ros.chunklog.logdir import fsync_dir
from csr_ros.chunklog.records import Checkpoint, ChunkRecord, Record, StreamRecord
from csr_ros.errors import ChunkLogError
from csr_ros.state import Chunk, CsrState, Seq

log = logging.getLogger("csr_ros.chunklog")


def rebuild_state(records: Iterable[Record], initial: CsrState) -> CsrState:
    """Fold `records` into `initial` (an empty state with the same tokenizer/layout/profile).

    Every chunk is re-tokenized from its logged text, as it was when it first arrived, so the
    rebuilt static token ids equal the original ones. Records that begin after chunk 0 without a
    checkpoint start the state there (with a warning). A `Checkpoint` first stands for every
    record before it: the state starts at its version and first chunk, and the static token
    count it names is checked once its chunks are in (a warning where it differs: the
    tokenizer, chat template or profile is not the one the log was written with).
    """
    assert not initial.chunks and initial.next_seq == 0, "rebuild from an empty state"
    state = initial
    base: Checkpoint | None = None      # the checkpoint whose chunks are still being folded
    started = False                     # a chunk or a checkpoint was folded
    for record in records:
        if isinstance(record, Checkpoint):
            if started:
                raise ChunkLogError(f"checkpoint v{record.version} comes after other records: a "
                                    "checkpoint opens the records it stands for")
            state.version, state.next_seq = record.version, Seq(record.first_seq)
            started, base = True, record
            base = _check_base(state, base)
            continue
        if isinstance(record, ChunkRecord):
            if not started and record.seq != state.next_seq:
                log.warning("the records begin at chunk %d, not %d, and no checkpoint opens "
                            "them: the chunks before it were never logged (the writer joined "
                            "late) or their segments were dropped; the state starts at it",
                            record.seq, state.next_seq)
                state.next_seq = Seq(record.seq)
            started = True
            ids = tuple(state.tokenizer.encode_data(record.text))
            state.append(Chunk(seq=record.seq, source=record.source, stamp_ns=record.stamp_ns,
                               text=record.text, token_ids=ids))
            base = _check_base(state, base)
            continue
        if isinstance(record, StreamRecord):
            continue
        if record.reason == "stream":      # the chunk stream began again at seq 0
            state = state.evicted(len(state.chunks))
            state.next_seq = Seq(0)
            state.version = record.version
            continue
        if record.next_seq > state.next_seq:
            msg = (f"version record v{record.version} covers chunks up to {record.next_seq} but "
                   f"only {state.next_seq} were logged before it")
            raise ChunkLogError(msg)
        n_drop = sum(1 for c in state.chunks if c.seq < record.first_seq)
        state = state.evicted(n_drop)
        state.version = record.version
    return state


def _check_base(state: CsrState, base: Checkpoint | None) -> Checkpoint | None:
    """Once the checkpoint's chunks are folded, compare the static token count it names."""
    if base is None or state.next_seq < base.next_seq:
        return base
    if base.n_static_tokens is not None and state.n_static != base.n_static_tokens:
        log.warning("the state rebuilt at checkpoint v%d has %d static tokens, the log's writer "
                    "had %d: the tokenizer, chat template or profile differs from the run that "
                    "wrote the log (the state is rebuilt with this one's)", base.version,
                    state.n_static, base.n_static_tokens)
    return None


# -- capsules at a committed boundary ------------------------------------------------------------

@dataclass(frozen=True)
class Resumed:
    n_from_capsule: int      # tokens restored from the capsule (0: no usable capsule)
    n_prefilled: int         # tokens prefilled after it (the whole run without a capsule)
    n_committed: int


def save_capsule(resource, path: str | Path) -> int:
    """Save the capsule of a local resource at its committed boundary (atomically, durably).

    Works in-process and through a `ProcessResource` (the capsule is written by the worker).
    Returns the number of committed tokens the capsule holds. `ChunkLog.save_capsule` puts
    one into the log and names it in the checkpoint.
    """
    return _on_resource(resource, _save_capsule_here, str(path))


def resume(resource, state: CsrState, capsule_path: str | Path | None) -> Resumed:
    """Make `resource` hold exactly `state`'s static run, restoring a capsule where it can.

    The capsule is used when its token ids are a prefix of the run (it was saved at an earlier
    committed boundary of the same version); then only the rest is prefilled. Otherwise, or
    without a capsule, the whole run is loaded.
    """
    path = None if capsule_path is None or not Path(capsule_path).exists() else str(capsule_path)
    return _on_resource(resource, _resume_here, tuple(state.static_ids), path)


def _on_resource(resource, func, *args):
    if resource.capabilities.worker:      # a ProcessResource: run it next to the engine
        return resource.apply(func, *args)
    return func(resource, *args)


def _save_capsule_here(resource, path: str) -> int:
    engine = resource.engine
    capsule = engine.snapshot()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    written = Path(engine.save_capsule(capsule, tmp))
    with open(written, "rb") as f:       # durable before it replaces the one a restart may use
        os.fsync(f.fileno())
    os.replace(written, target)
    fsync_dir(target.parent)
    return capsule.n_tokens


def _resume_here(resource, static_ids: tuple[int, ...], path: str | None) -> Resumed:
    engine = resource.engine
    if path is not None:
        try:
            capsule = engine.load_capsule(path)
        except Exception as exc:      # a stale or foreign capsule only costs a full prefill
            log.warning("capsule %s not usable (%s); prefilling the whole state", path, exc)
        else:
            n = capsule.n_tokens
            if 0 < n <= len(static_ids) and tuple(capsule.token_ids) == static_ids[:n]:
                engine.restore(capsule)
                if n < len(static_ids):
                    resource.extend(static_ids[n:])
                return Resumed(n_from_capsule=n, n_prefilled=len(static_ids) - n,
                               n_committed=resource.n_committed)
            log.warning("capsule %s (%d tokens) is not a prefix of the rebuilt state; "
                        "prefilling the whole state", path, n)
    resource.load(static_ids)
    return Resumed(n_from_capsule=0, n_prefilled=len(static_ids),
                   n_committed=resource.n_committed)
