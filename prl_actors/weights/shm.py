"""Same-host weight transfer: one /dev/shm file per version per host, read by every worker there.

Publisher side (`ShmPublisher`): once it knows the run id (its Welcome), it writes a *host file*
`/dev/shm/prl-<tag>.host` holding a random token (mode 0600) and an owner file (its pid namespace and
pid, so a later publisher can remove the files of one that was killed); each stored version is written once to
`/dev/shm/prl-<tag>-v<version>.weights` (written under a temporary name, then renamed: a reader never
sees half a file) and the previous version's file is unlinked (a worker still reading it keeps its
inode until it is done). `<tag>` is derived from the run id (hex), so runs never share files.

Worker side (`ShmReader`): a worker that can read the host file *proves* it shares the publisher's
/dev/shm, i.e. its host (or container IPC namespace), by sending the token in `fetch_weights.host_proof`;
a claimed hostname proves nothing. Only then does the publisher answer with `weights_begin.shm_path`
(no chunks). A path from the network is never trusted: the worker accepts exactly the path it derives
itself from its own run id and the announced version (so nothing outside /dev/shm, no other run's
file, no traversal), opened without following a symlink, and only a regular file owned by this user,
writable by nobody else, of exactly `total_bytes`. Anything else is refused and the worker fetches
chunks instead.

A trainer on the publisher's host uploads the same way (proved by the same host file): it writes
the new version's file itself (`write_snapshot`, straight from its tensors, atomically) and sends
WeightsBegin(shm_path, chunks 0) + WeightsEnd; the publisher derives the path itself, validates the
file as a worker would (this user's, writable by no one else, exactly `total_bytes`), maps it and
owns it from then on (`ShmPublisher.adopt`). Anything else is refused and the trainer sends chunks.

A worker maps the file copy-on-write: the tensors it hands the engine view the shared pages (no copy
here; the engine copies into its parameters, as from chunks), and nothing it does can change them.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import secrets
import stat
from pathlib import Path
from typing import TYPE_CHECKING

from prl_actors.records.files import write_private
from prl_actors.runtime.processes import pid_exists

if TYPE_CHECKING:
    from prl_actors.protocol.messages import WeightsBegin

SHM_ROOT = Path("/dev/shm")
TOKEN_CHARS = 64
HEADROOM = 64 << 20  # leave this much of /dev/shm free


class ShmRefused(Exception):
    """A shared-memory snapshot that must not be read (the message says why)."""


class ShmUnavailable(Exception):
    """The publisher cannot write a snapshot to shared memory (space, permissions)."""


def run_tag(run_id: str) -> str:
    """The file-name part of a run: hex only, whatever the run id holds."""
    return hashlib.sha256(run_id.encode()).hexdigest()[:16]


def host_file(root: Path, run_id: str) -> Path:
    return root / f"prl-{run_tag(run_id)}.host"


def snapshot_file(root: Path, run_id: str, version: int) -> Path:
    return root / f"prl-{run_tag(run_id)}-v{version}.weights"


class ShmPublisher:
    """The publisher's shared-memory files for one run (none until `open_run`)."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root
        self.run_id = ""
        self.token = ""
        self.published: dict[int, Path] = {}

    def open_run(self, run_id: str) -> None:
        """Write this run's host file (a fresh token) and owner file; files of an earlier run id are
        removed, and so are the files of publishers that died without removing theirs."""
        if run_id == self.run_id:
            return
        self.close()
        reap_stale(self.root)
        token = secrets.token_hex(TOKEN_CHARS // 2)
        write_private(owner_file(self.root, run_id), memoryview(_owner_id().encode()))
        write_private(host_file(self.root, run_id), memoryview(token.encode()))
        self.run_id, self.token = run_id, token

    def proves(self, proof: str) -> bool:
        """True when `proof` is this run's token (constant-time compare)."""
        return bool(self.token) and hmac.compare_digest(proof.encode(), self.token.encode())

    def publish(self, version: int, data: memoryview) -> memoryview:
        """Write `data` as `version` (the previous version's file is unlinked); returns a read-only
        mapping of the file, which can replace the caller's heap copy. Raises ShmUnavailable."""
        if not self.run_id:
            raise ShmUnavailable("no run id yet (not registered)")
        path = write_snapshot(self.root, self.run_id, version, [data])
        try:
            mapped = _map_shared(path, data.nbytes)
        except OSError as exc:
            raise ShmUnavailable(f"cannot map {path}: {exc}") from None
        self._own(version, path)
        return mapped

    def check_upload(self, begin: WeightsBegin) -> None:
        """Raises ShmRefused unless `begin` announces this run's file for its version (the path the
        publisher derives itself) with a consistent tensor table: what a trainer's upload must name."""
        if not self.run_id:
            raise ShmRefused("no run id yet (not registered)")
        announced_file(self.root, self.run_id, begin)

    def adopt(self, version: int, nbytes: int) -> memoryview:
        """Take over `version`'s file as the uploading trainer wrote it (write_snapshot): validated like a
        worker validates it, then mapped read-only and unlinked with the next version, as if written
        here. Raises ShmRefused (a bad file is removed)."""
        if not self.run_id:
            raise ShmRefused("no run id yet (not registered)")
        path = snapshot_file(self.root, self.run_id, version)
        try:
            _read_checked(path, nbytes).release()
            mapped = _map_shared(path, nbytes)
        except (OSError, ShmRefused) as exc:
            if path.exists() and version not in self.published:
                path.unlink(missing_ok=True)
            raise ShmRefused(str(exc)) from None
        self._own(version, path)
        return mapped

    def _own(self, version: int, path: Path) -> None:
        """`path` holds `version` from now on; the files of older versions are unlinked (a reader
        that still maps one keeps its pages until it is done)."""
        for old in [v for v in self.published if v != version]:
            self.published.pop(old).unlink(missing_ok=True)
        self.published[version] = path

    def path(self, version: int) -> str:
        """The file holding `version`, or "" when it is not in shared memory."""
        p = self.published.get(version)
        return str(p) if p is not None else ""

    def close(self) -> None:
        """Remove every file of this run (readers keep what they have mapped)."""
        for p in self.published.values():
            p.unlink(missing_ok=True)
        self.published = {}
        if self.run_id:
            host_file(self.root, self.run_id).unlink(missing_ok=True)
            owner_file(self.root, self.run_id).unlink(missing_ok=True)
        self.run_id, self.token = "", ""


def owner_file(root: Path, run_id: str) -> Path:
    return root / f"prl-{run_tag(run_id)}.owner"


def _owner_id() -> str:
    """This process as `<pid namespace> <pid>`: whether it still runs can be told only from its namespace."""
    return f"{os.readlink('/proc/self/ns/pid')} {os.getpid()}"


def reap_stale(root: Path) -> list[str]:
    """Remove the files of publishers of this user that are gone (SIGKILLed: no `close`), told by
    their owner file: same pid namespace and no such process. Returns the run tags removed."""
    removed = []
    for owner in root.glob("prl-*.owner"):
        try:
            if owner.lstat().st_uid != os.getuid() or not _dead(owner.read_text()):
                continue
        except (OSError, ValueError):
            continue
        tag = owner.name.removesuffix(".owner")
        for f in [*root.glob(f"{tag}-v*.weights"), root / f"{tag}.host", owner]:
            f.unlink(missing_ok=True)
        removed.append(tag)
    return removed


def _dead(owner_id: str) -> bool:
    namespace, pid = owner_id.rsplit(" ", 1)
    if namespace != os.readlink("/proc/self/ns/pid"):
        return False  # another container's: not ours to judge
    return not pid_exists(int(pid))


class ShmReader:
    """The worker's side: prove the host, then map a snapshot the publisher named, validated."""

    def __init__(self, root: Path = SHM_ROOT) -> None:
        self.root = root

    def proof(self, run_id: str) -> str:
        """The publisher's token if its host file is readable here (same host), else ""."""
        if not run_id:
            return ""
        try:
            raw = bytes(_read_checked(host_file(self.root, run_id), TOKEN_CHARS))
        except (OSError, ShmRefused):
            return ""
        text = raw.decode("ascii", "replace")
        return text if all(c in "0123456789abcdef" for c in text) else ""

    def open(self, run_id: str, begin: WeightsBegin) -> memoryview:
        """A writable (copy-on-write) view of the snapshot `begin` announces. Raises ShmRefused."""
        if not run_id:
            raise ShmRefused(f"shm_path {begin.shm_path!r} is not this run's file for version {begin.version}")
        path = announced_file(self.root, run_id, begin)
        try:
            return _read_checked(path, begin.total_bytes)
        except OSError as exc:
            raise ShmRefused(f"cannot map {path}: {exc}") from None


def announced_file(root: Path, run_id: str, begin: WeightsBegin) -> Path:
    """The file `begin` may name: exactly the one derived here from the run id and the version (a path
    from the network is never used as given), announced with a tensor table that adds up and no
    chunks to follow. Raises ShmRefused."""
    expected = snapshot_file(root, run_id, begin.version)
    if begin.shm_path != str(expected):
        raise ShmRefused(f"shm_path {begin.shm_path!r} is not this run's file for version {begin.version}")
    if begin.total_bytes != sum(m.nbytes for m in begin.tensors) or begin.chunks != 0:
        raise ShmRefused("weights_begin: total_bytes does not match the tensor table (or chunks follow)")
    return expected


def write_snapshot(root: Path, run_id: str, version: int, views: list[memoryview]) -> Path:
    """Write `views` (the packed tensors, in order) as `version`'s file of the run, atomically (a reader
    never sees half a file): the publisher's own copy, or a same-host trainer's upload. Raises
    ShmUnavailable (space, permissions)."""
    nbytes = sum(v.nbytes for v in views)
    free = _free_bytes(root)
    if free < nbytes + HEADROOM:
        raise ShmUnavailable(f"{root} has {free >> 20} MiB free, a snapshot needs {nbytes >> 20} MiB")
    path = snapshot_file(root, run_id, version)
    try:
        write_private(path, *views)
    except OSError as exc:
        raise ShmUnavailable(f"cannot write {path}: {exc}") from None
    return path


def _read_checked(path: Path, nbytes: int) -> memoryview:
    """A copy-on-write mapping of `path` if it is a regular file of this user, writable by no one
    else, of exactly `nbytes`; ShmRefused otherwise (OSError when it cannot be opened at all)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise ShmRefused(f"{path} is not a regular file of this user, writable only by it")
        if st.st_size != nbytes:
            raise ShmRefused(f"{path} holds {st.st_size} bytes, {nbytes} were announced")
        if nbytes == 0:
            return memoryview(bytearray())
        return memoryview(mmap.mmap(fd, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE))
    finally:
        os.close(fd)


def _map_shared(path: Path, nbytes: int) -> memoryview:
    """A read-only shared mapping (the publisher serves chunks from it)."""
    if nbytes == 0:
        return memoryview(b"")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return memoryview(mmap.mmap(fd, nbytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ))
    finally:
        os.close(fd)


def _free_bytes(root: Path) -> int:
    st = os.statvfs(root)
    return st.f_bavail * st.f_frsize
