"""The `transport:` section: how actors reach each other (ZeroMQ transport, addresses, auth, limits).

A section lives beside the code that reads it; prl_actors/config.py composes every section into the
run's `Config` and holds the rules that span sections (docs/CONFIG.md lists every field)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from prl_actors.sections import Section


class TransportSection(Section):
    kind: Literal["inproc", "ipc", "tcp"] = Field("tcp", description="ZeroMQ transport for every actor.")
    host: str = Field("127.0.0.1", description="tcp: the host actors bind to and connect to.")
    base_port: int | None = Field(
        None,
        ge=1024,
        le=65500,
        description="tcp: coordinator=base, publisher=+1, buffer=+2, trainer=+3 (learner=+5, classic RL). "
        "Not set: `up` picks the first free set from 27500 up and writes it to RUN_DIR/config.yaml; other "
        "commands use 27500.",
    )
    addresses: dict[str, str] = Field(
        default_factory=dict, description="Explicit per-role addresses (override the derived ones)."
    )
    bind_all: bool = Field(False, description="tcp: bind on all interfaces (*), e.g. in containers.")
    request_timeout_s: float = Field(10.0, gt=0, description="Any request without reply fails after this.")
    auth: Literal["curve", "none"] = Field(
        "curve",
        description="curve: every tcp/ipc socket is authenticated and encrypted with the run's keys "
        "(docs/SECURITY.md); none: any process that reaches a port is trusted, allowed only when every "
        "bound address is loopback or ipc (with a warning). inproc (one process) is never authenticated.",
    )
    keys_dir: str | None = Field(None, description="CurveZMQ keys (default RUN_DIR/keys); see `prl-actors keys`.")
    max_message_bytes: int = Field(
        0,
        ge=0,
        description="Largest control frame a socket accepts (ZMQ_MAXMSGSIZE; a bigger one disconnects the "
        "peer); 0 = derived from worker.group_size and sampling.max_new_tokens. Weight sockets accept "
        "publisher.chunk_bytes + 64 KiB.",
    )
    join_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A member gives up (exits with an error) when the coordinator does not answer its "
        "register, or says nothing at all once it joined, for this long. Also how long a run whose every "
        "worker was expelled (run.max_bad_groups) waits for another to join before it fails.",
    )
