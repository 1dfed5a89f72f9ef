# Two commands on a fresh machine: `make demo` and `make test`. Each creates .venv and installs
# everything it needs (torch pinned to the CPU wheel through constraints.txt).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP_FLAGS := -q -c constraints.txt $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)

.PHONY: demo test test-slow lint bench bench-quick clean install

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/pip install $(PIP_FLAGS) -e '.[dev,data]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/prl-actors up --config configs/demo.yaml --run-dir runs/demo-$$(date +%Y%m%d-%H%M%S)

lint: $(STAMP)
	$(BIN)/ruff check prl_actors cli tests bench
	$(BIN)/ruff format --check prl_actors cli tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

bench: $(STAMP)
	$(BIN)/prl-actors bench --out bench_out

bench-quick: $(STAMP)
	$(BIN)/prl-actors bench --quick --out bench_out

clean:
	rm -rf $(VENV) runs bench_out .pytest_cache .mypy_cache .ruff_cache
