# prl-actors: one image for every actor (`prl-actors actor ROLE`); docker-compose.yml runs it.
#
#   docker build --network host -t prl-actors .                          # CPU torch from the PyTorch index
#   docker build --network host --build-arg TORCH_INDEX_URL= -t prl-actors .   # no extra index (a local
#                                                                        # mirror or find-links has torch)
# Layers, least to most often changed: the user and the venv's owner, torch, the other dependencies,
# the source. Editing the source rebuilds only the last, small layer; torch is reinstalled only when
# constraints.txt changes. `prl-actors up --compose` does not build at all when the image is up to date
# (prl_actors/launch/compose.py, ImageInputs).
# Size: torch's CPU wheel (checked below: a CUDA torch fails the build), its few pure-Python
# dependencies and ours; no pip cache, no compiler, no tests/bench/docs (.dockerignore).
# Every instruction after the first large layer costs a copy of the whole image under the vfs storage
# driver (the dev VM's engine), so the metadata instructions come first and the actors' user (`prl`,
# which owns the venv /opt/prl) is set before the installs, not after.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

# No EXPOSE (compose publishes the coordinator's port itself; services reach each other without it) and
# no ENTRYPOINT (the base has none): fewer instructions, fewer copies.
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/prl PATH=/opt/prl/bin:$PATH
CMD ["prl-actors", "--help"]
WORKDIR /app

# bubblewrap: the code reward's sandbox (docs/SECURITY.md); it needs user namespaces in the container.
RUN apt-get update -q && apt-get install -y -q --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*

# The actors run as UID; the run-directory volume (/runs) and the secrets must be readable by it.
# torch: default the PyTorch CPU index (PyPI's Linux wheel is the CUDA build); `--build-arg
# TORCH_INDEX_URL=` turns the extra index off. constraints.txt pins the version.
ARG UID=1000 TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN useradd --create-home --uid "${UID}" --shell /usr/sbin/nologin prl \
 && mkdir -p /runs /opt/prl && chown prl:prl /runs /app /opt/prl
USER prl

# torch alone, in the venv: the largest layer. The wheel's C++ test binaries and models (torch/test,
# torch/bin but torch_shm_manager: ~130 MB, protoc among them) go; the headers (torch.compile's CPU
# code generation) stay.
COPY constraints.txt ./
RUN python3 -m venv /opt/prl \
 && pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -c constraints.txt torch \
 && python -c 'import sys, torch; sys.exit(torch.version.cuda and f"torch {torch.__version__} is a CUDA build (about 3 GB more): use a CPU index (TORCH_INDEX_URL)")' \
 && t=$(python -c 'import os, torch; print(os.path.dirname(torch.__file__))') \
 && rm -rf "$t/test" && find "$t/bin" -mindepth 1 ! -name torch_shm_manager -delete

# The other runtime dependencies, read from pyproject.toml (no source needed yet).
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt "setuptools>=68" \
 && rm /tmp/requirements.txt

# The source (what .dockerignore lets through): no dependency is resolved again.
COPY --chown=prl:prl . /app
RUN pip install --no-deps --no-build-isolation /app && rm -rf /app/build /app/*.egg-info
