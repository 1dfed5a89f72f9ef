"""Assignment tickets: the coordinator's proof, checked by the buffer, that a group was assigned.

The coordinator draws a random `key` when it starts and sends it to the buffer in every EpochOpen
(over the authenticated, encrypted coordinator -> buffer connection). With each assigned group it
gives the worker `mint(key, epoch, group_id, worker)`; the worker returns the ticket with the group,
and the buffer admits a group only if the ticket is valid for exactly that epoch, group id and sending
worker (which weights generated it is then judged by the on-policy rule, as for any group). So a
group is accepted only from a worker the coordinator assigned it to, whoever else holds a worker key;
the buffer needs no copy of the assignment table and no message per assignment, and a ticket cannot
arrive after the group it covers (it travels inside it).
A requeued group has one valid ticket per worker it was assigned to; the buffer's duplicate rule
keeps exactly one of their results.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable

TICKET_BYTES = 16


def new_key() -> bytes:
    return os.urandom(32)


def mint(key: bytes, epoch: int, group_id: int, worker: str) -> bytes:
    """BLAKE2b in keyed mode (a MAC, RFC 7693) over "<epoch>:<group_id>:<worker>", 16 bytes."""
    text = f"{epoch}:{group_id}:{worker}".encode()
    return hashlib.blake2b(text, key=key, digest_size=TICKET_BYTES).digest()


def valid(keys: Iterable[bytes], ticket: bytes, epoch: int, group_id: int, worker: str) -> bool:
    """Was `ticket` minted under one of `keys` for exactly this group and worker?"""
    return any(hmac.compare_digest(mint(k, epoch, group_id, worker), ticket) for k in keys)
