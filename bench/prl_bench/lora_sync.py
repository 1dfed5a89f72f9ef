"""Benchmark: one weight sync with LoRA (the adapter only) against full weights, end to end.

On a local random-init Qwen2 checkpoint in bfloat16 (built here, nothing downloaded), for each setup
(full fine-tuning; LoRA r=16 on q/k/v/o; LoRA r=16 on every projection) one weight version goes the
way a run sends it, each step timed separately (best of `repeats`):

  snapshot   the trainer's `learner.weights()` + `Snapshot.from_tensors` (cast to bf16, one buffer)
  upload     trainer -> the real PublisherCore in an ActorHost over tcp, until WeightsStored
  fetch      FetchWeights -> chunks -> assembled and unpacked in a worker *process* (real WorkerCore
             in an ActorHost), until its engine's load_weights is called
  apply      the real TorchEngine's load_weights: load_state_dict (full) or the adapter's hooks (LoRA)

Bytes are what crosses the wire (the snapshot). Informational entries: adapter / full for bytes and
for the total time.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from prl_bench import internals
from prl_bench.common import BenchContext, Entry, free_port, rounded
from prl_bench.fetcher import DEAD_ADDR, IdleEngine

CHUNK = 4 << 20  # publisher.chunk_bytes default
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SETUPS = {"full": None, "lora r=16 qkvo": ALL[:4], "lora r=16 all": ALL}


def build_checkpoint(out: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A random-init Qwen2 (bfloat16 on disk) with the built-in tokenizer's files."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from prl_actors.model.builtin import quiet_progress
    from prl_actors.model.tokenizer import build_tokenizer

    torch.manual_seed(0)
    heads = max(2, hidden // 64)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 8 * 8,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),
        tie_word_embeddings=False,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen2ForCausalLM(config)
    torch.nn.Module.to(model, torch.bfloat16)  # in place
    with quiet_progress():
        model.save_pretrained(out)
    build_tokenizer().save_pretrained(out)
    return out


def setup_config(model_dir: Path, targets: list[str] | None) -> Any:
    from prl_actors.config import load_config

    lora = {"r": 16, "alpha": 32, "target_modules": targets} if targets else None
    return load_config(None, {"model.path": str(model_dir), "model.dtype": "bfloat16", "trainer.lora": lora})


class TimedEngine(IdleEngine):
    """The real TorchEngine; records when load_weights was called and when it returned (it never
    generates)."""

    def __init__(self, cfg: Any, model_dir: Path) -> None:
        from prl_actors.engines.torch_engine import TorchEngine
        from prl_actors.launch import build

        self.inner = TorchEngine(build.engine_settings(cfg), model_dir)
        self.version = -1
        self.loaded = threading.Event()
        self.t_called = self.t_end = 0.0

    def load_weights(self, version: int, tensors: Any) -> None:
        self.t_called = time.monotonic()
        self.inner.load_weights(version, tensors)
        self.t_end = time.monotonic()
        self.version = -1  # every fetch is a fresh one
        self.loaded.set()


def serve(conn: Connection, cfg_yaml: str, model_dir: str, addr: str) -> None:
    """The worker process: a WorkerCore (torch tensors) around a TimedEngine, fetching on command."""
    import yaml
    import zmq

    from prl_actors.config import Config
    from prl_actors.protocol.messages import FetchWeights

    engine = TimedEngine(Config.model_validate(yaml.safe_load(cfg_yaml)), Path(model_dir))
    ctx = zmq.Context()
    core = internals.worker_core("worker-0", engine)
    core.as_torch = True
    host = internals.start_host(
        core, ctx, None, {"coordinator": DEAD_ADDR["tcp"], "publisher": addr, "buffer": DEAD_ADDR["tcp"]}
    )
    conn.send({"ready": True})
    while conn.recv() == "fetch":
        engine.loaded.clear()
        t0 = time.monotonic()
        internals.send(host, "publisher", FetchWeights(version=-1, sender="worker-0"))
        ok = engine.loaded.wait(120.0)
        conn.send(
            {"fetch_s": engine.t_called - t0, "apply_s": engine.t_end - engine.t_called} if ok else {"error": "timeout"}
        )
    internals.stop_host(host, 5.0)
    ctx.destroy(linger=0)


class Worker:
    """One worker process for every setup (the engine applies whatever arrives: full or adapter)."""

    def __init__(self, cfg: Any, model_dir: Path, addr: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(child, cfg.dump(), str(model_dir), addr), daemon=True)
        self.proc.start()
        if not self.conn.poll(300) or "ready" not in self.conn.recv():
            raise RuntimeError("the worker process did not start")

    def fetch(self) -> dict[str, float]:
        self.conn.send("fetch")
        if not self.conn.poll(180):  # the worker answers within its own 120 s wait, or it died
            raise RuntimeError("the worker process did not answer a fetch")
        reply: dict[str, Any] = self.conn.recv()
        if "error" in reply:
            raise RuntimeError(f"worker: {reply['error']}")
        return reply

    def close(self) -> None:
        self.conn.send("exit")
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


def one_setup(model_dir: Path, targets: list[str] | None, repeats: int, pub: Any, worker: Worker, v0: int) -> dict:  # type: ignore[type-arg]
    """Snapshot, upload, fetch and apply times (best of `repeats`, after one warm-up) and the bytes
    of one setup; its versions are v0, v0 + 1, ... (the publisher only takes newer ones)."""
    from prl_actors.launch.topology import learner_settings
    from prl_actors.training.grpo import GRPOLearner
    from prl_actors.weights.transfer import Snapshot

    learner = GRPOLearner(learner_settings(setup_config(model_dir, targets)), model_dir)
    snaps, snapshot_s = [], []
    for v in range(v0, v0 + repeats + 1):
        t0 = time.monotonic()
        snaps.append(Snapshot.from_tensors(v, learner.weights()))
        snapshot_s.append(time.monotonic() - t0)
    del learner
    upload_s, fetched = [], []
    for snap in snaps:
        upload_s.append(pub.upload(snap))
        fetched.append(worker.fetch())
    best = {"snapshot_s": min(snapshot_s[1:]), "upload_s": min(upload_s[1:])}
    best.update(fetch_s=min(r["fetch_s"] for r in fetched[1:]), apply_s=min(r["apply_s"] for r in fetched[1:]))
    best["total_s"] = sum(best.values())
    return {"bytes": float(snaps[0].nbytes), "tensors": float(len(snaps[0].metas)), **best}


def measure(model_dir: Path, repeats: int) -> dict[str, dict]:  # type: ignore[type-arg]
    from prl_bench.weight_sync import Publisher

    addr = f"tcp://127.0.0.1:{free_port()}"
    pub = Publisher("tcp", addr, CHUNK)
    worker = Worker(setup_config(model_dir, None), model_dir, addr)
    try:
        step = repeats + 1
        return {
            name: one_setup(model_dir, targets, repeats, pub, worker, 1 + i * step)
            for i, (name, targets) in enumerate(SETUPS.items())
        }
    finally:
        worker.close()
        pub.close()


def run(ctx: BenchContext) -> list[Entry]:
    hidden, layers, vocab = ctx.size((1024, 8, 32000), (512, 4, 8000), (64, 2, 64))
    repeats = ctx.size(5, 2, 1)
    model_dir = build_checkpoint(ctx.work_dir / "qwen2", hidden, layers, vocab)
    res = measure(model_dir, repeats)
    full = res["full"]
    params = int((model_dir / "model.safetensors").stat().st_size // 2)  # bf16 on disk
    entries = []
    for name in list(SETUPS)[1:]:
        r = res[name]
        info = rounded({"model_params_approx": params, "hidden": hidden, "layers": layers, "vocab": vocab})
        table = {k: rounded(v) for k, v in res.items()}
        ctx.say(
            f"  {name}: {r['bytes'] / 1e6:.2f} MB in {r['total_s'] * 1e3:.1f} ms vs full "
            f"{full['bytes'] / 1e6:.1f} MB in {full['total_s'] * 1e3:.1f} ms"
        )
        entries.append(
            Entry(
                "lora_sync",
                f"{name} bytes",
                "adapter bytes / full bytes per sync",
                r["bytes"],
                "bytes",
                r["bytes"] / full["bytes"],
                None,
                "<=",
                full["bytes"],
                {**info, "setups": table},
            )
        )
        entries.append(
            Entry(
                "lora_sync",
                f"{name} time",
                "adapter sync time / full sync time (snapshot+upload+fetch+apply)",
                r["total_s"],
                "s",
                r["total_s"] / full["total_s"],
                None,
                "<=",
                full["total_s"],
                {"setups": table},
            )
        )
    return entries
