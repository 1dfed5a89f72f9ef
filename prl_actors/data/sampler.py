"""Epoch sampling without replacement: a fresh permutation of the dataset per pass.

The prompts of the whole run form one stream: stream position i (i = epoch * B + group_id) is item
`perm_p[i mod N]` of pass p = i // N, where perm_p is a permutation of 0..N-1 seeded by (seed, p).
Every item is therefore used once per pass before any is repeated, and the prompts of an epoch are a
pure function of (seed, epoch, B, N): a resumed or replayed run sees exactly the same prompts. The
data position after epoch e is (pass, offset) = divmod((e + 1) * B, N) (see data/position.py).
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache

SAMPLER = "permutation-v1"
"""Recorded with the data position; change it whenever the stream order below changes."""


def pass_seed(seed: int, pass_index: int, size: int) -> int:
    """A stable 63-bit seed for one pass (sha256 of the parts; no torch needed here)."""
    digest = hashlib.sha256(f"{SAMPLER}:{seed}:{pass_index}:{size}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@lru_cache(maxsize=4)
def permutation(seed: int, pass_index: int, size: int) -> tuple[int, ...]:
    """The order of pass `pass_index` over `size` items (Python's Mersenne Twister: stable across
    platforms and Python versions for a given integer seed)."""
    order = list(range(size))
    random.Random(pass_seed(seed, pass_index, size)).shuffle(order)
    return tuple(order)


class EpochSampler:
    """Item indices of each epoch; stateless (everything is derived from seed and epoch)."""

    def __init__(self, seed: int, size: int) -> None:
        if size < 1:
            raise ValueError("an epoch sampler needs at least one item")
        self.seed, self.size = seed, size

    def indices(self, epoch: int, n: int) -> list[int]:
        """The item index of every group 0..n-1 of `epoch` (n = groups per epoch)."""
        return [self.at(i) for i in range(epoch * n, (epoch + 1) * n)]

    def at(self, stream_pos: int) -> int:
        pass_index, offset = divmod(stream_pos, self.size)
        return permutation(self.seed, pass_index, self.size)[offset]

    def position(self, epoch: int, n: int) -> tuple[int, int]:
        """(pass, offset) of the first prompt of `epoch`: where the data stands when it begins."""
        return divmod(epoch * n, self.size)
