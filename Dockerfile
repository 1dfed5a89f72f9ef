FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY prl_actors prl_actors
COPY cli cli
COPY configs configs
# CPU torch wheel from the PyTorch index (the pin in constraints.txt keeps it the CPU build).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt .
ENTRYPOINT []
