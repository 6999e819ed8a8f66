"""`evalctl export wandb RUN` / `evalctl export mlflow RUN`: a finished run in an experiment
tracker, where the team already compares its training runs.

What goes over, to both: the summary metrics of `evalctl report` (accuracy, counts, cache
hits, throughput, tokens), latency percentiles, accuracy and size per category, the run's
manifest as the tracker run's config (flattened: `generation.max_tokens`, ...; the whole
manifest also as `manifest.json`), identity tags (run id, model, dataset and manifest hashes)
and the results table (W&B: a `wandb.Table`; MLflow: `results.parquet` and `results.jsonl`
artifacts). The tracker run is named after the evalstream run.

Where: W&B as `wandb.init` finds it (WANDB_API_KEY, WANDB_MODE, WANDB_DIR; `--offline`
writes the run under --dir only, for `wandb sync` later); MLflow at --tracking-uri (else
MLFLOW_TRACKING_URI, else a local file store `./mlruns`). `--wait` waits for the run to
complete first: `evalctl submit ... && evalctl export mlflow RUN --wait`, or
`evalctl submit --wait --export mlflow` to export whenever a submitted run completes.

The trackers' packages (wandb, mlflow-skinny) are imported only here, when asked for.
"""

from __future__ import annotations

import argparse
from typing import Any

from evalstream.cli.common import fail, out_json, wait_for_run
from evalstream.cli.trackers import export_run
from evalstream.common.settings import ExportSettings, Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="a run's metrics, per-category accuracy, latency, manifest and results to W&B or MLflow",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    defaults = ExportSettings.from_env()  # the trackers' own variables (WANDB_*, MLFLOW_*)
    trackers = p.add_subparsers(dest="tracker", required=True)
    w = trackers.add_parser("wandb", help="to Weights & Biases (online, or --offline files)")
    w.add_argument("--project", default=defaults.wandb_project)
    w.add_argument("--entity", default=defaults.wandb_entity or None)
    w.add_argument("--dir", default=defaults.wandb_dir, help="where W&B keeps its run files")
    w.add_argument(
        "--offline", action="store_true", help="write the run under --dir only (`wandb sync` later)"
    )
    m = trackers.add_parser("mlflow", help="to an MLflow tracking server or store")
    m.add_argument(
        "--tracking-uri",
        default=defaults.mlflow_tracking_uri,
        help="e.g. http://mlflow:5000 or file:/path/mlruns (default MLFLOW_TRACKING_URI, else file:./mlruns)",
    )
    m.add_argument("--experiment", default=defaults.mlflow_experiment_name)
    for parser in (w, m):
        parser.add_argument("run", help="run id")
        parser.add_argument("--wait", action="store_true", help="wait for the run to complete first")
        parser.add_argument(
            "--timeout", type=float, default=None, help="with --wait: give up after this many s"
        )
        parser.add_argument("--json", action="store_true", help="print what was exported as JSON")
    p.set_defaults(handler=cmd_export)


def options(args: argparse.Namespace) -> dict[str, Any]:
    if args.tracker == "wandb":
        return {
            "project": args.project,
            "entity": args.entity,
            "directory": args.dir,
            "offline": args.offline,
        }
    return {"tracking_uri": args.tracking_uri, "experiment": args.experiment}


async def cmd_export(args: argparse.Namespace, settings: Settings) -> None:
    if args.wait:
        await wait_for_run(settings, args.run, timeout=args.timeout, quiet=True)
    try:
        done = await export_run(settings, args.run, args.tracker, **options(args))
    except LookupError as exc:
        fail(str(exc))
        return
    except ImportError as exc:
        fail(
            f"{exc}: `pip install {'wandb' if args.tracker == 'wandb' else 'mlflow-skinny'}` to export there"
        )
        return
    if args.json:
        out_json(done)
    else:
        print(f"exported {args.run} to {done['tracker']}: run {done['run']}, {len(done['metrics'])} metrics")
