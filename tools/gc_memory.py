"""Peak RSS of one trainer forward/backward with and without trainer.gradient_checkpointing
(docs/MEMORY.md). One process per measurement:

    python tools/gc_memory.py CHECKPOINTING(0|1) HIDDEN LAYERS GROUPS RESPONSE_TOKENS
    python tools/gc_memory.py 0 512 8 8 128; python tools/gc_memory.py 1 512 8 8 128
"""
import json, random, resource, sys, tempfile, time
from pathlib import Path
import torch
torch.set_num_threads(1)
from prl_actors.config import load_config
from prl_actors.launch.topology import learner_settings
from prl_actors.launch import build
from prl_actors.protocol.messages import Group, Sample
from prl_actors.training.grpo import GRPOLearner

RUN = tempfile.mkdtemp(prefix="gc-memory-")
ckpt = sys.argv[1] == "1"
hidden, layers, groups, G, resp = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), 8, int(sys.argv[5])
cfg = load_config(None, {"model.hidden_size": hidden, "model.layers": layers, "model.heads": 8, "model.warm_start_steps": 0,
    "trainer.gradient_checkpointing": ckpt, "trainer.micro_batch_tokens": 10**9, "trainer.micro_batch_groups": 10**6,
    "worker.sampling.max_new_tokens": resp, "run.run_dir": RUN})
model_dir = build.model_dir(cfg, Path(RUN))
learner = GRPOLearner(learner_settings(cfg), model_dir)
V = learner.policy.config.vocab_size
rng = random.Random(0)
gs = [Group(group_id=i, prompt="x", prompt_ids=[rng.randrange(3, V) for _ in range(32)], worker="w",
      samples=[Sample(text="", token_ids=[rng.randrange(3, V) for _ in range(resp)], logprobs=[], reward=float(j % 2)) for j in range(G)])
      for i in range(groups)]
learner.begin_epoch(0, groups)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
for g in gs:
    learner.accumulate(g)
learner.flush()
dt = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
params = sum(p.numel() for p in learner.policy.parameters())
print(json.dumps({"checkpointing": ckpt, "params_M": round(params / 1e6, 2), "tokens": groups * (32 + G * resp),
                  "rss_before_MiB": round(base / 1024), "rss_peak_MiB": round(peak / 1024), "delta_MiB": round((peak - base) / 1024), "fwd_bwd_s": round(dt, 2)}))
