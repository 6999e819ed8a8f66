"""evalctl stays light: submitting a job (evalstream.common.jobs, the CLI's entry) loads no
FastStream, uvicorn, asyncpg or torch, which only the services need."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("faststream", "uvicorn", "torch", "openvino")


def test_the_cli_and_the_job_path_load_no_service_framework() -> None:
    code = (
        "import json, sys\n"
        "import evalstream.common.jobs, evalstream.cli.main\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
