#!/bin/sh
# The image's install and compile steps, in one place. The Dockerfile runs them; CI runs the same
# script in a fresh virtualenv (tests/deploy/test_image.py), because no Docker engine runs there.
# Run from the source tree (where pyproject.toml is), with the target environment's python first
# on PATH.
#
#   install.sh deps cpu|gpu    third-party dependencies only, read from pyproject.toml, so their
#                              image layer is rebuilt only when the dependencies change
#   install.sh app             the ttsvc package itself (source layer), dependencies untouched,
#                              then `pip check` proves the deps layer still satisfies it
#   install.sh engines DIR     compile the packaged default voice into DIR (cpu image) and
#                              synthesize one sentence from it, so a broken image fails its build
set -eu

pip_install() {
    python -m pip install --no-cache-dir --disable-pip-version-check "$@"
}

case "${1:-}" in
deps)
    case "${2:-}" in
    cpu) extras="" ;;
    gpu) extras="trt" ;;  # TensorRT + cuda-python; no PyTorch anywhere in the tree
    *) echo "usage: install.sh deps cpu|gpu" >&2; exit 2 ;;
    esac
    requirements="$(mktemp)"
    # tomllib: Python >= 3.11, which both images have
    python - "$extras" >"$requirements" <<'PY'
import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = [e for e in sys.argv[1].split(",") if e]
print("\n".join(project["dependencies"] + [d for e in extras for d in project["optional-dependencies"][e]]))
PY
    pip_install --requirement "$requirements"
    rm -f "$requirements"
    ;;
app)
    pip_install --no-deps .
    python -m pip check
    ;;
engines)
    dir="${2:?usage: install.sh engines DIR}"
    ttsvc compile --checkpoint default --output-dir "$dir"
    ttsvc engines ls --engines-dir "$dir"
    wav="$(mktemp --suffix=.wav)"
    TTSVC_COMPILE_DEFAULT_VOICE=false ttsvc synth "The image works." --engines-dir "$dir" -o "$wav"
    rm -f "$wav"
    ;;
*)
    echo "usage: install.sh deps cpu|gpu | app | engines DIR" >&2
    exit 2
    ;;
esac
