"""One decode step as one launch: CUDA graphs per step shape, captured on first use.

`StepRunner.run(shape, fn)` calls `fn` (a decode step: static shapes, inputs and outputs in static
buffers, no host read) eagerly on CPU and NPU; on CUDA it captures `fn` once per shape (batch
bucket x width bucket) with `torch.cuda.graphs` and replays the graph afterwards, so a step costs one
launch instead of one per kernel. A captured graph reads the very tensors it was captured with:
whoever changes them (new weights in new tensors, a LoRA hook, a reallocated cache, other sampling
settings) passes a new `key`, and every graph captured under the old key is dropped.

Capture runs `fn` a few times first (warm-up, on a side stream, as torch.cuda.graphs requires); the
buffers those runs change are saved before and restored after (`state`), so the warm-up leaves no
trace. All graphs share one memory pool (they never run concurrently). Capture is thread-local (an
actor in another thread of the process may use the device meanwhile); a capture that fails leaves
the runner eager for good, with the reason in `failed` (the batch logs it once).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import torch

WARMUP = 2
"""Eager runs of a step before it is captured (cuBLAS and allocator warm-up)."""


class StepRunner:
    """Runs decode steps: eagerly, or as CUDA graphs on a CUDA device (see module docstring)."""

    def __init__(self, device: torch.device, capture: bool | None = None) -> None:
        self.capture = device.type == "cuda" if capture is None else capture
        self.graphs: dict[Hashable, Any] = {}
        self.key: Hashable = None
        self.captures = 0  # graphs captured so far (for notes, tests and the bench)
        self.replays = 0  # graph launches so far
        self.failed = ""  # why capture was given up ("" while it works)
        self._pool: Any = None

    def run(
        self, shape: Hashable, fn: Callable[[], None], key: Hashable, state: Callable[[], list[torch.Tensor]]
    ) -> None:
        """One step of `shape`: `fn` itself, or its graph (captured now if new). `state()` lists the
        buffers `fn` changes (restored after the warm-up)."""
        if not self.capture:
            fn()
            return
        if key != self.key:
            self.graphs.clear()
            self.key = key
        graph = self.graphs.get(shape)
        if graph is None:
            try:
                graph = self.graphs[shape] = self._capture(fn, state)
            except RuntimeError as exc:  # e.g. an operation capture does not allow: run eagerly from now on
                self.capture, self.failed = False, f"{type(exc).__name__}: {exc}"[:300]
                self.graphs.clear()
                fn()
                return
        graph.replay()
        self.replays += 1

    @staticmethod
    def warm(fn: Callable[[], None], state: Callable[[], list[torch.Tensor]]) -> None:
        """Run `fn` WARMUP times and undo what it changed in `state()` (the buffers it writes)."""
        saved = [(t, t.clone()) for t in state()]
        for _ in range(WARMUP):
            fn()
        for t, copy in saved:
            t.copy_(copy)

    def reset(self) -> None:
        """Drop every graph (the tensors they read are about to change)."""
        self.graphs.clear()
        self.key = None

    def _capture(self, fn: Callable[[], None], state: Callable[[], list[torch.Tensor]]) -> Any:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.warm(fn, state)
        torch.cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            fn()
        self.captures += 1
        return graph
