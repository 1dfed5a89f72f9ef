"""Who a peer is: CurveZMQ key files, the ZAP handler that checks them, and names -> roles.

Keys (docs/SECURITY.md): a directory (RUN_DIR/keys by default) of ZeroMQ certificates, every file 0600:

    <name>.key          public key  (the registry: a peer is admitted iff its public key is here)
    <name>.key_secret   public + secret key of <name>

`prl-actors up` creates one key per role (coordinator, publisher, buffer, trainer, worker, operator,
and any role added to protocol.messages.Role). A key's *name* is its identity: the role is the part
before the first '-' ("worker-gpu1" is a worker), and a key named N may speak as N or as any
"N-..." name (the `worker` key covers worker-0, worker-1, ...; the `operator` key covers the CLI's
"operator-<pid>-<n>"). An actor uses the secret of its own name, or else of the longest prefix of
its name that has one (worker-3 -> worker-3.key_secret, else worker.key_secret).

Every bound ROUTER is a CURVE server (its actor's key); every DEALER is a CURVE client that knows the
server's public key, so a client also knows whom it talks to. The ZAP handler (one thread per
zmq.Context, pyzmq's ThreadAuthenticator) admits a client iff its public key is in the directory,
re-read whenever the directory changes (`prl-actors keys create/revoke` act on the next handshake),
and labels the connection with the key's name: every frame from it carries that name as the
"User-Id" property, which the port reads as the message's authenticated principal.
Without a ZAP handler libzmq would admit any CURVE client, so `Security.serve` starts one first.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from prl_actors.protocol.messages import Role, role_prefix
from prl_actors.records.files import write_private

PUBLIC, SECRET = ".key", ".key_secret"
ZAP_DOMAIN = "prl-actors"


class KeysError(Exception):
    """A key is missing or unreadable; the message says which and what to do (for the user)."""


def role_of_name(name: str) -> Role | None:
    """The role a name (or key name) belongs to: the part before the first '-', if it is a role."""
    return Role.of_name(name)


def speaks_for(principal: str, name: str) -> bool:
    """May the holder of key `principal` use `name` (as message sender or routing id)?"""
    return name == principal or (name.startswith(principal) and name[len(principal) : len(principal) + 1] == "-")


def run_key_names() -> list[str]:
    """The keys `prl-actors up` creates: one per role."""
    return [r.value for r in Role]


# --- key files -------------------------------------------------------------------------------


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path` (0600) whole or not at all: a server reading the directory meanwhile
    must never see a key file half written (it would refuse that key, and libzmq does not retry)."""
    write_private(path, text.encode())


def _cert(public: bytes, secret: bytes | None) -> str:
    kind = "Secret" if secret else "Public"
    lines = [f"#   ZeroMQ CURVE {kind} Certificate (prl-actors)", "", "metadata", "curve"]
    lines.append(f'    public-key = "{public.decode()}"')
    if secret:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def create_keys(directory: Path, names: Iterable[str], overwrite: bool = False) -> list[str]:
    """Create a keypair per name (a name must start with a role); existing ones are kept unless
    `overwrite`. Returns the names created. The directory is 0700, every file 0600."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    made = []
    for name in names:
        if role_of_name(name) is None or "/" in name or name.startswith("."):
            raise KeysError(f"key name {name!r} must start with a role ({', '.join(Role)})")
        if (directory / f"{name}{SECRET}").exists() and not overwrite:
            continue
        public, secret = zmq.curve_keypair()
        _write_private(directory / f"{name}{SECRET}", _cert(public, secret))
        _write_private(directory / f"{name}{PUBLIC}", _cert(public, None))
        made.append(name)
    return made


def ensure_key(name: str, keys: Path, authenticated: bool) -> None:
    """Give `name` its own key in `keys` (Config.keys_path) before it starts (a worker `up` or
    LocalCluster starts), so that it is the only holder of its name: the servers admit it at its first
    handshake (KeyStore). Nothing unless the run is `authenticated` (Config.authenticated)."""
    if authenticated:
        create_keys(keys, [name])


# roles with many members: their role key (`worker`) may speak as every member (worker-0, worker-1 ...)
SHARED_ROLE_KEYS = (Role.WORKER.value, Role.ENV.value)


def export_keys(directory: Path, name: str, out: Path) -> list[str]:
    """Copy what the holder of `name` needs into `out`: its secret and every public key.

    Only a key created under exactly that name is exported (never a prefix's: an unknown
    `worker-gpu1` must not carry away the `worker` key), and never the role key of a role with many
    members (`worker`, `env`), which could act as every one of them."""
    if name in SHARED_ROLE_KEYS:
        raise KeysError(
            f"the {name!r} role key can act as every {name}-... member and is not exported; "
            f"create one key per member: prl-actors keys create {name}-NAME, then export {name}-NAME"
        )
    if not (directory / f"{name}{SECRET}").is_file():
        raise KeysError(
            f"no key named {name!r} in {directory}: create it first (prl-actors keys create {name}), then export it"
        )
    key_name, _, _ = KeyStore(directory).keypair_for(name)
    out.mkdir(parents=True, exist_ok=True)
    os.chmod(out, 0o700)
    files = [f"{key_name}{SECRET}", *sorted(p.name for p in directory.glob(f"*{PUBLIC}"))]
    for f in files:
        _write_private(out / f, (directory / f).read_text())
    return files


@dataclass
class KeyStore:
    """The key directory of a run, read lazily; the public-key registry is re-read when it changes:
    when the directory's mtime moved, and, for a key not in the registry, when its file names differ
    from those read (mtimes are as coarse as the kernel's clock tick: a key created a moment after
    the last read may leave the mtime where it was, and a refused handshake is not retried by libzmq,
    so a new member must never be refused for that)."""

    directory: Path
    _registry: dict[bytes, str] = field(default_factory=dict)
    _stamp: int = -1
    _names: frozenset[str] = frozenset()
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def public(self, name: str) -> bytes:
        path = self.directory / f"{name}{PUBLIC}"
        if not path.exists():
            raise KeysError(f"no public key of {name!r} in {self.directory} (copy {name}{PUBLIC} there)")
        return zmq.auth.load_certificate(path)[0]

    def keypair_for(self, name: str) -> tuple[str, bytes, bytes]:
        """(key name, public, secret) of `name`: its own key, else its longest prefix's."""
        parts = name.split("-")
        for n in range(len(parts), 0, -1):
            key_name = "-".join(parts[:n])
            path = self.directory / f"{key_name}{SECRET}"
            if path.exists():
                public, secret = zmq.auth.load_certificate(path)
                if secret:
                    return key_name, public, secret
        raise KeysError(
            f"no secret key for {name!r} in {self.directory}: create one with `prl-actors keys create` "
            f"or copy an exported {role_prefix(name)}{SECRET} there"
        )

    def name_of(self, public_z85: bytes) -> str | None:
        """The key name registered for a public key, or None (not admitted)."""
        with self._lock:
            self._refresh()
            name = self._registry.get(public_z85)
            if name is None and self._listing() != self._names:  # created in the same tick as the last read
                self._stamp = -1
                self._refresh()
                name = self._registry.get(public_z85)
            return name

    def _listing(self) -> frozenset[str]:
        try:
            return frozenset(os.listdir(self.directory))
        except OSError:
            return frozenset()

    def _refresh(self) -> None:
        try:
            stamp = self.directory.stat().st_mtime_ns
        except OSError:
            self._registry, self._stamp = {}, -1
            return
        if stamp == self._stamp:
            return
        names = self._listing()
        registry: dict[bytes, str] = {}
        complete = True
        for path in sorted(self.directory.glob(f"*{PUBLIC}")):
            name = path.name[: -len(PUBLIC)]
            if role_of_name(name) is None:
                continue
            try:
                registry.setdefault(zmq.auth.load_certificate(path)[0], name)
            except (OSError, ValueError):  # being written by a tool that does not rename: read it again
                complete = False
        self._registry, self._stamp, self._names = registry, stamp if complete else -1, names


# --- the ZAP handler ---------------------------------------------------------------------------


class _Authenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread: admits registered keys, names the connection after its key."""

    def __init__(self, ctx: zmq.SyncContext, store: KeyStore) -> None:
        super().__init__(ctx)
        self.store = store
        self.denied: deque[tuple[float, str, str]] = deque(maxlen=256)  # (time, peer address, why)
        self._address = ""

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._address = msg[3].decode(errors="replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:  # credentials provider (z85 key)
        if self.store.name_of(key) is not None:
            return True
        self.denied.append((time.monotonic(), self._address, f"unknown key {key[:8].decode(errors='replace')}..."))
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self.store.name_of(z85.encode(client_public_key)) or ""


_guards: weakref.WeakKeyDictionary[zmq.SyncContext, _Authenticator] = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def guard(ctx: zmq.SyncContext, store: KeyStore) -> _Authenticator:
    """The ZAP handler of `ctx`, started on first use (one per context, one key directory)."""
    with _guards_lock:
        auth = _guards.get(ctx)
        if auth is None:
            auth = _Authenticator(ctx, store)
            auth.start()
            auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=auth)
            _guards[ctx] = auth
        elif auth.store.directory.resolve() != store.directory.resolve():
            raise KeysError(f"one zmq.Context serves one key directory ({auth.store.directory})")
        return auth


def close_context(ctx: zmq.SyncContext) -> None:
    """Stop `ctx`'s ZAP handler (if any), then destroy the context."""
    with _guards_lock:
        auth = _guards.pop(ctx, None)
    if auth is not None:
        auth.stop()
    ctx.destroy(linger=0)


def pop_denial(ctx: zmq.SyncContext, since: float) -> str:
    """The oldest ZAP denial of `ctx` after `since` ("address: why"), or ""."""
    auth = _guards.get(ctx)
    while auth is not None and auth.denied:
        t, address, why = auth.denied.popleft()
        if t >= since:
            return f"{address}: {why}"
    return ""


@dataclass
class Security:
    """CURVE settings for one actor's sockets (`name` is the actor; its key may be a prefix's)."""

    store: KeyStore
    name: str
    key_name: str = ""
    public: bytes = b""
    secret: bytes = b""

    def __post_init__(self) -> None:
        self.key_name, self.public, self.secret = self.store.keypair_for(self.name)

    def serve(self, ctx: zmq.SyncContext, sock: zmq.SyncSocket) -> None:
        """Make `sock` (before bind) a CURVE server whose clients the ZAP handler checks."""
        guard(ctx, self.store)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())

    def connect(self, sock: zmq.SyncSocket, peer: str) -> None:
        """Make `sock` (before connect) a CURVE client of the actor `peer`."""
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.store.public(peer))
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
