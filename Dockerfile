# syntax=docker/dockerfile:1
# Two targets; `docker build .` gives the last one, cpu:
#   docker build -t ttsvc:0.1.0 .                     CPU, ONNX Runtime, default voice built in
#   docker build --target gpu -t ttsvc:0.1.0-gpu .    CUDA + TensorRT, engines from the HostPath
# Every install and compile step is docker/install.sh, which CI also runs in a fresh virtualenv.
# Both images run as a non-root user on a read-only root filesystem: the only writes at run time
# go to /tmp (the engine cache copies that workers load from), an emptyDir in Kubernetes.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# ---- gpu: CUDA runtime base; TensorRT and cuda-python from pip, no PyTorch ----------------------
FROM ${CUDA_IMAGE} AS gpu
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv \
 && useradd --system --uid 10001 --no-create-home --home-dir /tmp ttsvc
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
WORKDIR /build
COPY pyproject.toml README.md docker/install.sh ./
RUN sh install.sh deps gpu
COPY src ./src
RUN sh install.sh app && rm -rf /build
COPY docker/healthcheck.py /opt/ttsvc/healthcheck.py
WORKDIR /tmp
# Engines are TensorRT plans built on a matching GPU and mounted at this path (the HostPath);
# the read-only image never compiles anything itself.
# a container is reached through its own network namespace: listen on every interface there
# (a bare `ttsvc serve` defaults to loopback)
ENV TTSVC_ENGINES_DIR=/opt/ttsvc/engines TTSVC_ENGINE_CACHE_DIR=/tmp/engine-cache \
    TTSVC_COMPILE_DEFAULT_VOICE=false TTSVC_HOST=0.0.0.0
USER 10001:10001
EXPOSE 9000 9091
HEALTHCHECK --interval=5s --timeout=4s --start-period=120s CMD ["python", "/opt/ttsvc/healthcheck.py"]
ENTRYPOINT ["ttsvc"]
CMD ["serve"]

# ---- build: the cpu image's virtualenv and compiled engines, left behind with pip's leftovers --
FROM ${PYTHON_IMAGE} AS build
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /build
COPY pyproject.toml README.md docker/install.sh ./
RUN sh install.sh deps cpu
COPY src ./src
RUN sh install.sh app && sh install.sh engines /opt/ttsvc/engines

# ---- cpu (default): slim Python, ONNX Runtime, the default voice compiled in -------------------
FROM ${PYTHON_IMAGE} AS cpu
RUN useradd --system --uid 10001 --no-create-home --home-dir /tmp ttsvc
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/ttsvc/engines /opt/ttsvc/engines
COPY docker/healthcheck.py /opt/ttsvc/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp \
    TTSVC_ENGINES_DIR=/opt/ttsvc/engines TTSVC_ENGINE_CACHE_DIR=/tmp/engine-cache \
    TTSVC_COMPILE_DEFAULT_VOICE=false TTSVC_HOST=0.0.0.0
WORKDIR /tmp
USER 10001:10001
EXPOSE 9000 9091
HEALTHCHECK --interval=5s --timeout=4s --start-period=30s CMD ["python", "/opt/ttsvc/healthcheck.py"]
# exec form: ttsvc is PID 1 and gets SIGTERM itself, which starts its drain
ENTRYPOINT ["ttsvc"]
CMD ["serve"]
