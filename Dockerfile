# prl-actors: one image for every actor (`prl-actors actor ROLE`); docker-compose.yml runs it.
#
#   docker build --network host -t prl-actors .                          # CPU torch from the PyTorch index
#   docker build --network host --build-arg TORCH_INDEX_URL= -t prl-actors .   # no extra index (a local
#                                                                        # mirror or find-links has torch)
# Layers, least to most often changed: OS user, torch, the other dependencies, the source. Editing
# the source rebuilds only the last, small layer; torch is reinstalled only when constraints.txt changes.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

# The actors run as this user; the run-directory volume (/runs) and the secrets must be readable by it.
ARG UID=1000
RUN useradd --create-home --uid "${UID}" --shell /usr/sbin/nologin prl \
 && mkdir -p /runs /app && chown prl:prl /runs
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# torch alone: the largest layer. Default: the PyTorch CPU index (PyPI's Linux wheel is the CUDA
# build); `--build-arg TORCH_INDEX_URL=` turns the extra index off. constraints.txt pins the version.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY constraints.txt ./
RUN pip install ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} -c constraints.txt torch

# The other runtime dependencies, read from pyproject.toml (no source needed yet).
COPY pyproject.toml ./
RUN python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip install -c constraints.txt -r /tmp/requirements.txt "setuptools>=68" wheel \
 && rm /tmp/requirements.txt

# The source (what .dockerignore lets through): no dependency is resolved again.
COPY . /app
RUN pip install --no-deps --no-build-isolation /app && rm -rf /app/build /app/*.egg-info

USER prl
EXPOSE 27500-27503
ENTRYPOINT []
CMD ["prl-actors", "--help"]
