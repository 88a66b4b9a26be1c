"""A chunk log whose disk fills up: a clear error, no half record, and appending again once
space is freed. Real limits, in a child process: a file-size limit (RLIMIT_FSIZE: EFBIG) and,
where the machine lets a private mount namespace mount one, a full tmpfs (ENOSPC)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from csr_ros.chunklog import ChunkLog, ChunkRecord, VersionRecord, read_log, rebuild_state
from csr_ros.state import CsrState

ROOT = Path(__file__).resolve().parents[1]

FILL_UP = r"""
import json, logging, os, resource, signal, sys
from csr_ros.chunklog import ChunkLog, ChunkRecord, VersionRecord, read_from_checkpoint, read_log
from csr_ros.errors import ChunkLogFullError
from csr_ros.state import Chunk

mode, path = sys.argv[1], sys.argv[2]
warnings = []
handler = logging.Handler()
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("csr_ros.chunklog").addHandler(handler)


def chunk(seq):
    text = f"{seq}s camera: mug_{seq % 5} at 1.{seq % 9}0,0.25 and a longer tail of words\n"
    return Chunk(seq=seq, source="cam", stamp_ns=seq, text=text, token_ids=())


log = ChunkLog(path, fsync_interval_s=0)
if mode == "fsize":                  # the file may not grow past 20 kB: EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))
    free = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
else:                                # a filler takes what the tmpfs has left: ENOSPC
    filler = os.path.join(os.path.dirname(path), "filler")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    os.close(fd)
    free = lambda: os.unlink(filler)
out = {}
seq = 0
try:
    while True:
        log.append_chunk(chunk(seq))
        seq += 1
        if seq == 10:
            log.append_version(1, 5, 10, "swap")
except ChunkLogFullError as exc:
    out["error"] = str(exc)
out["written"] = seq
del warnings[:]
out["readable"] = [r.seq for r in read_log(path) if isinstance(r, ChunkRecord)]
out["reader_warnings"] = list(warnings)
log.append_version(2, 8, seq, "swap")          # a swap while the disk is full
out["pending"] = log.pending_versions
try:
    log.append_chunk(chunk(seq))
    out["still_full"] = None
except ChunkLogFullError as exc:
    out["still_full"] = str(exc)
free()
for _ in range(5):
    log.append_chunk(chunk(seq))
    seq += 1
out["pending_after"] = log.pending_versions
log.close()
out["records"] = [[type(r).__name__, getattr(r, "seq", getattr(r, "version", None))]
                  for r in read_log(path)]
restart = read_from_checkpoint(path)
out["restart_from"] = next(r.version for r in restart if type(r).__name__ == "Checkpoint")
out["restart_chunks"] = [r.seq for r in restart if isinstance(r, ChunkRecord)]
print(json.dumps(out))
"""


def run_fill_up(argv: list[str]) -> dict:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_recovered(out: dict, errno_name: str) -> None:
    written = out["written"]
    assert written > 10
    assert "was not written" in out["error"] and f"({errno_name})" in out["error"]
    assert "appending works again once space is freed" in out["error"]
    assert out["readable"] == list(range(written)), "every record before the failed one"
    assert out["reader_warnings"] == [], "no torn record left behind"
    assert out["pending"] == 1, "the swap is held, not lost"
    assert f"chunk {written} was not written, nor the version record ahead of it" in \
        out["still_full"]
    assert out["pending_after"] == 0
    kinds = out["records"]
    chunks = [seq for kind, seq in kinds if kind == "ChunkRecord"]
    assert chunks == list(range(written + 5)), "nothing lost, duplicated or reordered"
    assert kinds.index(["VersionRecord", 2]) == kinds.index(["ChunkRecord", written]) - 1
    assert out["restart_from"] == 2 and out["restart_chunks"] == list(range(8, written + 5))


def test_a_file_past_its_size_limit_raises_chunk_log_full_error_and_appending_resumes(
        tmp_path, tokenizer, layout):
    path = tmp_path / "log"
    out = run_fill_up([sys.executable, "-c", FILL_UP, "fsize", str(path)])
    check_recovered(out, "EFBIG")
    with ChunkLog(path) as chunk_log:
        state = rebuild_state(chunk_log.records, CsrState(tokenizer=tokenizer, layout=layout,
                                                          profile="A robot."))
    assert state.version == 2 and [c.seq for c in state.chunks] == \
        list(range(8, out["written"] + 5))
    assert [r.seq for r in read_log(path) if isinstance(r, ChunkRecord)][-1] == \
        out["written"] + 4
    assert any(isinstance(r, VersionRecord) and r.version == 1 for r in read_log(path))


def test_a_full_tmpfs_raises_chunk_log_full_error_and_appending_resumes_once_space_is_freed(
        tmp_path):
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--mount", "--propagation", "private", "sh",
                            "-c", f"mount -t tmpfs -o size=64k tmpfs {tmp_path}"],
                           capture_output=True, text=True) if unshare else None
    if probe is None or probe.returncode != 0:
        pytest.skip("no private mount namespace with a tmpfs here "
                    f"({probe.stderr.strip() if probe else 'no unshare'}); the file-size limit "
                    "test covers a full file")
    mount = tmp_path / "mnt"
    mount.mkdir()
    out = run_fill_up([unshare, "--mount", "--propagation", "private", "sh", "-c",
                       'mount -t tmpfs -o size=256k tmpfs "$0" && exec "$1" -c "$2" tmpfs '
                       '"$0/log"', str(mount), sys.executable, FILL_UP])
    check_recovered(out, "ENOSPC")
    assert not any(mount.iterdir()), "the tmpfs lived in the child's namespace only"
