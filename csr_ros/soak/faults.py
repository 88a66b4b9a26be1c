"""When faults come and how a full disk is made: the seeded fault plan, and the small file system
that holds the chunk log during a soak.

    plan = FaultPlan(("kill_host", "disk_full"), every_s=180.0, seed=0)
    at_s, kind = plan.next()                 # wall seconds since the start, and the kind

    fs = LogFileSystem.mount(run_dir / "logfs", size_mb=512)   # before any thread starts
    fs.fill(host_pid)                        # ENOSPC from now on (or EFBIG, see below)
    fs.free(host_pid)
    unmount(run_dir / "logfs")               # at the end, once no process holds it

Every kind comes once per round, in a seeded order, so a short soak with `--faults all` sees
each; the gaps between faults are `every_s` times a seeded factor between 0.5 and 1.5. Where the
next planned fault would fall after the end, a soak whose kinds include kill_host ends its faults
with one (`plan.closing`): its restart, at the end of the day, is measured against the first one,
so a process that aged on the way shows it.

The file system is a tmpfs of `size_mb` in a mount namespace of this process's own (its
children inherit it; it disappears with the last of them): filling it gives the chunk log a
real ENOSPC, and nothing outside the soak sees it. It is unmounted before the run directory is
removed: a mount point cannot be removed (EBUSY). Where a private mount namespace cannot be
made (not root), the chunk log lives in a plain directory and "full" is a file-size limit set
on the state's process (RLIMIT_FSIZE: EFBIG, which the log treats as a full disk).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import random
import resource
import subprocess
from pathlib import Path

from csr_ros.waiting import wait_until

log = logging.getLogger("csr_ros.soak")

_CLONE_NEWNS = 0x00020000
_MNT_DETACH = 2
FILLER = "filler"
CLOSING_KIND = "kill_host"
CLOSING_LEAD = 2.0        # a closing fault comes this many fault margins before the end


class FaultPlan:
    def __init__(self, kinds: tuple[str, ...], *, every_s: float, seed: int):
        self.kinds = tuple(kinds)
        self.every_s = every_s
        self._rng = random.Random(seed * 7_919 + 17)
        self._round: list[str] = []
        self._at_s = 0.0

    def next(self) -> tuple[float, str] | None:
        """The next fault: when (wall seconds since the start) and which; None without kinds."""
        if not self.kinds:
            return None
        if not self._round:
            self._round = list(self.kinds)
            self._rng.shuffle(self._round)
        self._at_s += self.every_s * self._rng.uniform(0.5, 1.5)
        return self._at_s, self._round.pop(0)

    def closing(self, last_kind: str | None) -> str | None:
        """The fault that ends a soak whose next planned one falls after its end: a restart of
        the state's process (`CLOSING_KIND`) where the plan has that kind and the last fault was
        not one; else None."""
        if CLOSING_KIND in self.kinds and last_kind != CLOSING_KIND:
            return CLOSING_KIND
        return None

    def after(self, now_s: float) -> None:
        """Faults come no sooner than a gap after `now_s` (the last one's recovery)."""
        self._at_s = max(self._at_s, now_s)

    def choice(self, options: list):
        return self._rng.choice(options)

    def uniform(self, low: float, high: float) -> float:
        return self._rng.uniform(low, high)


class LogFileSystem:
    """Where the chunk log lives, and how to fill it up."""

    def __init__(self, root: Path, mode: str, why: str = ""):
        self.root = root
        self.mode = mode               # tmpfs | fsize
        self.why = why                 # why not tmpfs
        self._limited_pid: int | None = None

    @classmethod
    def mount(cls, root: Path, *, size_mb: int) -> "LogFileSystem":
        """A tmpfs of `size_mb` at `root` in a private mount namespace, or a plain directory
        (see the module docstring). Call it before this process starts any thread."""
        root.mkdir(parents=True, exist_ok=True)
        why = _private_tmpfs(root, size_mb)
        if why is None:
            return cls(root, "tmpfs")
        log.warning("no private tmpfs for the chunk log (%s): a full disk is simulated by a "
                    "file-size limit on the state's process (EFBIG)", why)
        return cls(root, "fsize", why)

    @property
    def describe(self) -> str:
        if self.mode == "tmpfs":
            return "ENOSPC: a tmpfs in a private mount namespace, filled by another file"
        return f"EFBIG: a file-size limit on the state's process ({self.why})"

    def fill(self, host_pid: int, log_path: Path) -> None:
        if self.mode == "tmpfs":
            fd = os.open(self.root / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            block = b"\0" * (1 << 20)
            try:
                while True:
                    os.write(fd, block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
            try:                      # the last partial block too: nothing left at all
                while os.write(fd, b"\0" * 4096):
                    pass
            except OSError:
                pass
            finally:
                os.close(fd)
            return
        segments = sorted(log_path.glob("*.seg"))
        limit = max(1, segments[-1].stat().st_size) if segments else 1
        _, hard = resource.prlimit(host_pid, resource.RLIMIT_FSIZE)
        resource.prlimit(host_pid, resource.RLIMIT_FSIZE, (limit, hard))
        self._limited_pid = host_pid

    def free(self) -> None:
        if self.mode == "tmpfs":
            (self.root / FILLER).unlink(missing_ok=True)
            return
        if self._limited_pid is not None:
            try:
                _, hard = resource.prlimit(self._limited_pid, resource.RLIMIT_FSIZE)
                resource.prlimit(self._limited_pid, resource.RLIMIT_FSIZE, (hard, hard))
            except ProcessLookupError:
                pass                    # the state's process is gone: its limit went with it
            self._limited_pid = None


def _private_tmpfs(root: Path, size_mb: int) -> str | None:
    """Mount a tmpfs at `root` in a new mount namespace of this process; why not, or None."""
    if os.geteuid() != 0:
        return "not root"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}"
    for cmd in (["mount", "--make-rprivate", "/"],
                ["mount", "-t", "tmpfs", "-o", f"size={int(size_mb)}m", "tmpfs", str(root)]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            return f"{' '.join(cmd[:2])}: {done.stderr.strip()}"
    return None


def unmount(root: Path, *, timeout_s: float = 30.0) -> str | None:
    """Unmount the file system at `root` once no process holds a file in it (the state's
    process and its workers end a moment after they are stopped or killed). Still held after
    `timeout_s`: detached (it goes once its last holder closes), and what held it, else None."""
    libc = ctypes.CDLL(None, use_errno=True)

    def unmounted() -> tuple[str | None] | None:
        """(None,) once unmounted, (why,) when it cannot be, None while the mount is busy."""
        if libc.umount2(str(root).encode(), 0) == 0:
            return (None,)
        err = ctypes.get_errno()
        return None if err == errno.EBUSY else (f"could not unmount {root}: {os.strerror(err)}",)
    done = wait_until(unmounted, timeout_s)
    if done is not None:
        return done[0]
    holders = _holders(root)
    libc.umount2(str(root).encode(), _MNT_DETACH)
    return f"{root} still held after {timeout_s:.0f} s by {holders}; detached"


def _holders(root: Path) -> list[str]:
    """'pid (name)' of each process with a file or its working directory under `root`."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = [os.readlink(f"/proc/{pid}/cwd")] + \
                [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            if any(link == str(root) or link.startswith(f"{root}/") for link in links):
                out.append(f"{pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})")
        except OSError:
            continue
    return out
