"""evalstream's Grafana boards as code (grafana-foundation-sdk). Generates the JSON that
docker-compose's Grafana provisions from ops/grafana/dashboards:

    .venv/bin/python ops/grafana/boards.py           # write ops/grafana/dashboards/*.json
    .venv/bin/python ops/grafana/boards.py --check   # exit 1 if the committed JSON is stale

Edit the boards here, never in Grafana's UI (provisioning forbids saving them there).
tests/unit/test_boards.py checks that the committed JSON equals a fresh generation, and
tests/e2e/test_observability.py that every panel's query returns data from the real
Prometheus after a run. Metric names: libs/common/evalstream/common/metrics.py; recording
rules (evalstream:*): ops/prometheus/rules/evalstream.yml.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # boardkit/, also when loaded by path
from boardkit.run_boards import runs
from boardkit.service_boards import kafka, overview, workers
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder

OUT = Path(__file__).resolve().parent / "dashboards"


BOARDS: dict[str, Callable[[], db.Dashboard]] = {
    "evalstream-overview.json": overview,
    "evalstream-workers.json": workers,
    "evalstream-kafka.json": kafka,
    "evalstream-runs.json": runs,
}


def render(make: Callable[[], db.Dashboard]) -> str:
    built = make().build()
    for i, panel in enumerate(built.panels or [], start=1):
        panel.id_val = i  # stable ids: links to a panel (viewPanel=<id>) survive regeneration
    return json.dumps(built, cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def panel_queries(board_json: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(panel title, its queries) of every panel of a generated board."""
    return [
        (panel["title"], [t["expr"] for t in panel.get("targets", [])])
        for panel in board_json["panels"]
        if panel.get("targets")
    ]


def substitute(
    expr: str, variables: dict[str, str], *, rate_interval: str = "30s", range_: str = "1h"
) -> str:
    """An expression as Grafana would send it: template variables and the built-in
    $__rate_interval / $__range / $__interval replaced."""
    out = (
        expr.replace("$__rate_interval", rate_interval)
        .replace("$__range", range_)
        .replace("$__interval", "15s")
    )
    for name in sorted(variables, key=len, reverse=True):  # $run_id before a $run
        out = out.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 if a committed board differs from the code")
    args = ap.parse_args()
    stale = []
    for name, make in BOARDS.items():
        path, text = OUT / name, render(make)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}; run: .venv/bin/python ops/grafana/boards.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
