# syntax=docker/dockerfile:1
# Tolk's image: the server, its Python dependencies from pyproject.toml, and the shipped weights, so it serves
# offline. See docs/deploy.md.
#
#   docker build -t tolk .                                             # torch as plain pip resolves it
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch CPU wheel index> -t tolk .         # CPU-only torch, small
#   docker build --build-arg TORCH_INDEX_URL=<PyTorch CUDA wheel index> -t tolk:cuda .   # a chosen CUDA build
#
# BASE_IMAGE may be any Debian or Ubuntu image; one without Python (a CUDA runtime image) gets Python from apt,
# which must be 3.11 or newer (Ubuntu 24.04 and later).
ARG BASE_IMAGE=python:3.12-slim

FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN if ! command -v python3 >/dev/null; then \
        apt-get update \
        && apt-get install -y --no-install-recommends python3 python3-venv \
        && rm -rf /var/lib/apt/lists/*; \
    fi


FROM base AS build
ARG TORCH_VERSION=2.13.0
# Empty: plain `pip install torch==TORCH_VERSION`, which on Linux x86_64 brings several GB of CUDA libraries.
# Set it to PyTorch's CPU wheel index for a CPU-only image, or to one of its CUDA indexes to pick the CUDA build.
ARG TORCH_INDEX_URL=""
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first and alone, so that the dependencies below find it installed and never resolve it again. (Pinned
# through TORCH_VERSION, which hadolint cannot see.)
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"
WORKDIR /src
# The dependencies, read from pyproject.toml, in a layer of their own: editing the code does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c \
        'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY model/ model/
COPY server/ server/
# hadolint ignore=DL3013
RUN pip install --no-deps .
# The CPU kernels compiled ahead for the shipped models (`tolk build-kernels`, model/native.py), for the CPU this
# image is built on: a container on a machine with the same CPU (`docker compose up --build` builds where it runs)
# decodes without numba, about 190 MB less a scheduler process and no compiling before /ready. On another CPU the
# extension does not match and the server compiles the kernels with numba's JIT, as an image built with KERNELS=0.
# The compilers (numba's pycc checks for C and C++) and Python's headers stay in this stage. A failed build leaves
# the JIT and says so.
ARG KERNELS=1
ENV TOLK_KERNELS_DIR=/opt/tolk-kernels
COPY weights/ weights/
# $needed is one word per package
# hadolint ignore=DL3008,SC2086
RUN mkdir -p "$TOLK_KERNELS_DIR" \
    && if [ "$KERNELS" = 1 ]; then \
        headers=$(python -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
        needed=""; \
        command -v g++ >/dev/null || needed="g++"; \
        [ -f "$headers/Python.h" ] || needed="$needed python3-dev"; \
        if [ -n "$needed" ]; then \
            { apt-get update && apt-get install -y --no-install-recommends $needed; } >/tmp/apt.log 2>&1 \
                || { tail -5 /tmp/apt.log; echo "no C compiler: the kernels stay on numba's JIT"; }; \
        fi; \
        tolk build-kernels --model weights/en-pt --model weights/pt-en \
            || echo "kernels not compiled ahead: the server compiles them with numba's JIT"; \
    fi


FROM base AS runtime
# /var/lib/tolk: what must outlive a restart (glossaries, SQLite), the one directory the server writes; mount a
# volume there to keep it across containers.
RUN groupadd --system --gid 10001 tolk \
    && useradd --system --uid 10001 --gid tolk --home-dir /app --no-create-home --shell /usr/sbin/nologin tolk \
    && install -d -o 10001 -g 10001 /var/lib/tolk
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/tolk-kernels /opt/tolk-kernels
WORKDIR /app
# The shipped models, owned by root and only readable by the server. Mount a directory on /app/weights to serve
# other (imported) models instead.
COPY weights/ weights/
# Where no kernels compiled ahead match this CPU, numba keeps the compiled decode step (model/kernels.py) in
# NUMBA_CACHE_DIR; the image's own files are read-only, so the first start compiles it there (/ready 22-38 s after
# the start on 2 cores) and a new container does again.
ENV PATH=/opt/venv/bin:$PATH \
    TOLK_DATA_DIR=/var/lib/tolk \
    TOLK_KERNELS_DIR=/opt/tolk-kernels \
    NUMBA_CACHE_DIR=/tmp/numba
USER 10001:10001
EXPOSE 8000
# /ready answers 200 once every model is loaded and its scheduler runs; the slim base has no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/ready', timeout=4)"]
# tolk is PID 1 (exec form, no shell): SIGTERM reaches uvicorn, which stops accepting connections, lets in-flight
# requests finish (at most TOLK_REQUEST_TIMEOUT + 5 s), stops the schedulers and exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tolk"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
