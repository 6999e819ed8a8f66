"""The benchmarks' side virtualenvs, for tools the project does not depend on: lm-eval's
(bench/.venv-lmeval, sharing the project's torch; bench/.venv-lmeval-ov with optimum-intel for
its openvino backend) and cleanlab's (bench/.venv-cleanlab, a plain one). Each is created on
first use and reused after; what creating it cost is recorded."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import paths
from bench.harness.recording import log

LMEVAL_VERSION = "0.4.13"
VENV = paths.BENCH / ".venv-lmeval"
VENV_OV = paths.BENCH / ".venv-lmeval-ov"
OPTIMUM_INTEL = "optimum-intel[openvino]==2.2.0"
CLEANLAB_VENV = paths.BENCH / ".venv-cleanlab"
CLEANLAB_VERSION = "2.9.0"


def pip_install(python: Path, *requirements: str, **run: Any) -> None:
    """`pip install` into one of the benchmarks' side venvs (lm-eval's, cleanlab's): quiet,
    no version nag; `run` goes to subprocess.run (capture_output, timeout)."""
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        check=True,
        **run,
    )


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / f).lstat().st_size
    return total


def ensure_lmeval_venv(
    venv: Path = VENV, extras: tuple[str, ...] = (), probe: str = "import lm_eval"
) -> dict[str, Any]:
    """A venv with lm-eval (and `extras`), reusing the project's torch; created if missing."""
    py = venv / "bin" / "python"
    record = venv / "evalstream-install.json"  # what creating it cost, kept for later runs
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        first = json.loads(record.read_text()) if record.exists() else None
        return {"created": False, "path": str(venv), "size_bytes": dir_bytes(venv), "when_created": first}
    log(
        f"creating {venv} with lm-eval {LMEVAL_VERSION} {' '.join(extras)} "
        "(the project's torch is shared, not reinstalled)"
    )
    shutil.rmtree(venv, ignore_errors=True)
    info = json.loads(
        subprocess.run(
            [
                str(paths.PY),
                "-c",
                "import sys, sysconfig, json; print(json.dumps([sys.base_prefix, sysconfig.get_paths()['purelib'],"
                " f'python{sys.version_info[0]}.{sys.version_info[1]}']))",
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    base_prefix, project_site, pyver = info
    t0 = time.monotonic()
    subprocess.run([f"{base_prefix}/bin/python3", "-m", "venv", str(venv)], check=True)
    # Appended after the venv's own site-packages: lm-eval's dependencies win, torch,
    # transformers and accelerate come from the project (pip sees them as installed) unless
    # an extra pins another version, which then lands in the venv and shadows the project's.
    site = venv / "lib" / pyver / "site-packages"
    (site / "evalstream-project.pth").write_text(
        str(paths.ROOT / ".venv" / "lib" / pyver / "site-packages") + "\n"
    )
    assert Path(project_site).resolve() == (paths.ROOT / ".venv" / "lib" / pyver / "site-packages").resolve()
    pip_install(py, f"lm-eval=={LMEVAL_VERSION}", *extras)
    seconds = time.monotonic() - t0
    torch_bytes = sum(
        dir_bytes(p) for p in Path(project_site).iterdir() if p.name == "torch" or p.name.startswith("nvidia")
    )
    out = {
        "created": True,
        "path": str(venv),
        "install_s": round(seconds, 1),
        "size_bytes": dir_bytes(venv),
        "shared_torch_bytes_not_downloaded": torch_bytes,
        "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    record.write_text(json.dumps(out, indent=1))
    return out


def ensure_cleanlab_venv() -> tuple[Path | None, dict[str, Any]]:
    """(the python of bench/.venv-cleanlab, what happened); created on first use."""
    py = CLEANLAB_VENV / "bin" / "python"
    if (
        py.exists()
        and subprocess.run([str(py), "-c", "import cleanlab"], capture_output=True).returncode == 0
    ):
        return py, {"created": False, "path": str(CLEANLAB_VENV)}
    log(f"creating {CLEANLAB_VENV} with cleanlab {CLEANLAB_VERSION}")
    shutil.rmtree(CLEANLAB_VENV, ignore_errors=True)
    t0 = time.monotonic()
    try:
        # a plain venv of the interpreter the project's venv was made from
        base = Path(sys.base_prefix) / "bin" / "python3"
        subprocess.run([str(base), "-m", "venv", str(CLEANLAB_VENV)], check=True, capture_output=True)
        pip_install(py, f"cleanlab=={CLEANLAB_VERSION}", capture_output=True, timeout=900)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        return None, {"created": False, "error": f"cleanlab did not install: {exc}"}
    return py, {"created": True, "path": str(CLEANLAB_VENV), "install_s": round(time.monotonic() - t0, 1)}


def ensure_api_extra() -> None:
    """lm-eval's `[api]` extra (aiohttp, tenacity, requests, tqdm) in bench/.venv-lmeval."""
    py = VENV / "bin" / "python"
    check = [str(py), "-c", "import aiohttp, tenacity, requests, tqdm"]
    if subprocess.run(check, capture_output=True).returncode == 0:
        return
    log(f"adding lm-eval[api]=={LMEVAL_VERSION} to {VENV}")
    pip_install(py, f"lm-eval[api]=={LMEVAL_VERSION}")
