"""The architecture's import boundaries, read from the source (ast, nothing imported):

* no service imports another service (producer, router, worker, aggregator);
* the shared library (libs/common) imports no service and not the CLI;
* the CLI imports no service: it is a client of the services' topics and tables;
* only the worker imports torch, OpenVINO or pynvml (the other images do not install them);
* no CLI module imports a CLI command (a module of main.COMMAND_MODULES): commands parse, call
  the library and print; what they share is cli/common.py (and non-command helpers);
* every package under evalstream/ is a known component (a new one must be placed here first);
* the SQL of the result tables (item_results, runs) is written in the query module
  (analysis/queries.py) or on the write path (SQL_ALLOWED), nowhere else.

Every import counts, function-local ones and those under `try: ... except ImportError` too
(an import that may fail in one image is still a dependency on another component's code),
relative ones (resolved against the importing module's package) and `import_module("...")`
with a literal name.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("producer", "router", "worker", "aggregator")
WORKER_ONLY = ("torch", "pynvml", "openvino", "openvino_genai", "openvino_tokenizers")
# What is checked: the product's code. bench/ is left out on purpose: its lm-eval driver
# imports torch to run the reference harness, and benchmarks may drive any component.
CHECKED = ("libs", "services", "cli", "ops")

# Imports still crossing a boundary, each with what removes it. The test fails on any other
# violation, and on an entry here that no longer occurs (so the list cannot go stale). Empty:
# regrade is a message the services act on, and the item checks audit needs are libs/common's.
KNOWN: dict[tuple[str, str], str] = {}
COMPONENTS = (*SERVICES, "common", "cli")  # the packages evalstream.<x> may be
# CLI modules that are no command: what commands share (main imports them by name)
CLI_SHARED = ("common", "main", "progress", "trackers", "__main__", "__init__")
# The result tables' SQL outside the query module, each with why it stays there.
RESULT_TABLES = re.compile(r"\b(item_results|runs)\b")
SQL_STATEMENT = re.compile(r"^\s*\(?\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b", re.IGNORECASE)
SQL_ALLOWED = {
    # every read of the result tables, by design
    "libs/common/evalstream/common/analysis/queries.py": "the query module",
    # the write path: the aggregator writes results and completes runs; its reads (which rows
    # a batch already holds, a segment to mirror, a run's state) run inside those writes
    "services/aggregator/evalstream/aggregator/store.py": "the aggregator's write path",
    # the producer creates, rejects and publishes runs; its one read is the idempotency
    # check of a job it may have seen before, in the same transaction
    "services/producer/evalstream/producer/intake.py": "the producer's write path",
}


@dataclass(frozen=True)
class Violation:
    path: str  # relative to the checked root
    line: int
    module: str  # what is imported
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: imports {self.module} ({self.rule})"


def component(path: Path) -> str | None:
    """ "common", "cli", a service name, "ops", or None for what is not checked."""
    parts = path.parts
    if parts[:2] == ("libs", "common"):
        return "common"
    if parts[0] == "services" and len(parts) > 1 and parts[1] in SERVICES:
        return parts[1]
    if parts[0] in ("cli", "ops"):
        return parts[0]
    return None


def package_of(rel: Path) -> list[str]:
    """The package a file's module is in (["evalstream", "router"] for
    services/router/evalstream/router/app.py), [] outside an evalstream tree."""
    parts = list(rel.parts)
    if "evalstream" not in parts:
        return []
    return parts[parts.index("evalstream") : -1]


def imported_modules(
    source: str,
    package: list[str] | None = None,
    modules: set[str] = frozenset(),  # type: ignore[assignment]
) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement at any depth, relative ones
    resolved against `package`, and of every `import_module("literal")`; `from p import m`
    also names p.m when that is one of `modules` (a CLI command)."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:  # `from ..worker import x` in evalstream/router/: evalstream.worker
                up = (package or [])[: max(0, len(package or []) - (node.level - 1))]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if not base:
                continue
            out += [(node.lineno, base)]
            # `from evalstream import worker` (or `from .. import worker`) names a component too
            out += [
                (node.lineno, f"{base}.{a.name}")
                for a in node.names
                if base == "evalstream" or f"{base}.{a.name}" in modules
            ]
        elif (
            isinstance(node, ast.Call)
            and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            out += [(node.lineno, node.args[0].value)]
    return out


def command_modules(root: Path) -> set[str]:
    """The CLI's command modules, as cli/main.py lists them (read, not imported)."""
    main = root / "cli/evalstream/cli/main.py"
    if not main.exists():
        return set()
    for node in ast.walk(ast.parse(main.read_text(encoding="utf-8"))):
        if isinstance(node, ast.AnnAssign | ast.Assign) and "COMMAND_MODULES" in ast.unparse(node):
            assert node.value is not None
            return {ast.literal_eval(e) for e in node.value.elts}  # type: ignore[attr-defined]
    return set()


def rule_broken(owner: str, module: str, commands: set[str] = frozenset(), path: str = "") -> str | None:  # type: ignore[assignment]
    """Why `owner` (a component; the file at `path`) may not import `module`, or None."""
    top = module.split(".")[0]
    if top in WORKER_ONLY and owner != "worker":
        return f"only the worker imports {top}"
    parts = module.split(".")
    if parts[0] != "evalstream" or len(parts) < 2:
        return None
    target = parts[1]
    if target in SERVICES and owner in SERVICES and target != owner:
        return f"service {owner} imports service {target}"
    if owner == "common" and (target in SERVICES or target == "cli"):
        return f"libs/common imports {target}"
    if owner == "cli" and target in SERVICES:
        return f"the CLI imports service {target}"
    if target not in COMPONENTS:
        return f"evalstream.{target} is no known component"
    if owner == "cli" and module in commands and not path.endswith("/main.py"):
        return "a CLI module imports a CLI command"
    return None


def violations(root: Path) -> list[Violation]:
    found = []
    commands = command_modules(root)
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            owner = component(rel)
            package = package_of(rel)
            if owner is None and len(package) > 1:  # an evalstream package of no component
                found.append(Violation(rel.as_posix(), 1, ".".join(package[:2]), "no known component"))
                continue
            if owner is None:
                continue
            source = path.read_text(encoding="utf-8")
            for line, module in imported_modules(source, package, commands):
                if rule := rule_broken(owner, module, commands, rel.as_posix()):
                    found.append(Violation(rel.as_posix(), line, module, rule))
    return found


def sql_on_result_tables(root: Path) -> list[str]:
    """path:line of every string literal (f-strings by their literal parts) that is a SQL
    statement on item_results or runs, outside SQL_ALLOWED."""
    found = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in SQL_ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.JoinedStr):
                    text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    text = node.value
                else:
                    continue
                if SQL_STATEMENT.match(text) and RESULT_TABLES.search(text):
                    found.append(f"{rel}:{node.lineno}")
    return sorted(set(found))


def test_no_import_crosses_a_boundary() -> None:
    found = violations(ROOT)
    new = [str(v) for v in found if (v.path, v.module) not in KNOWN]
    assert new == [], "imports across component boundaries:\n" + "\n".join(new)
    stale = sorted(set(KNOWN) - {(v.path, v.module) for v in found})
    assert stale == [], f"KNOWN lists imports that are gone: remove {stale}"


def test_the_result_tables_sql_is_in_the_query_module() -> None:
    assert sql_on_result_tables(ROOT) == []
    stale = [p for p in SQL_ALLOWED if not (ROOT / p).exists()]
    assert stale == [], f"SQL_ALLOWED names files that are gone: {stale}"


def plant(root: Path, rel: str, code: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(code))


def test_the_checker_finds_planted_violations(tmp_path: Path) -> None:
    plant(
        tmp_path,
        "services/router/evalstream/router/ok.py",
        "from evalstream.common import topics\nimport json\n",
    )
    plant(tmp_path, "services/worker/evalstream/worker/gpu.py", "import pynvml\nimport torch.cuda\n")
    assert violations(tmp_path) == []  # the clean tree passes
    plant(
        tmp_path,
        "services/router/evalstream/router/bad.py",
        "from evalstream.worker.grading import get_grader\n",
    )
    plant(
        tmp_path,
        "libs/common/evalstream/common/bad.py",
        """
        def late():
            try:
                from evalstream.aggregator import store
            except ImportError:
                pass
        """,
    )
    plant(
        tmp_path,
        "cli/evalstream/cli/bad.py",
        "from evalstream import producer\nimport evalstream.producer.intake\n",
    )
    plant(tmp_path, "services/aggregator/evalstream/aggregator/bad.py", "import torch\n")
    plant(tmp_path, "libs/common/evalstream/common/gpu.py", "from pynvml import nvmlInit\n")
    assert sorted(str(v) for v in violations(tmp_path)) == [
        "cli/evalstream/cli/bad.py:1: imports evalstream.producer (the CLI imports service producer)",
        "cli/evalstream/cli/bad.py:2: imports evalstream.producer.intake (the CLI imports service producer)",
        "libs/common/evalstream/common/bad.py:4: imports evalstream.aggregator (libs/common imports aggregator)",
        "libs/common/evalstream/common/gpu.py:1: imports pynvml (only the worker imports pynvml)",
        "services/aggregator/evalstream/aggregator/bad.py:1: imports torch (only the worker imports torch)",
        "services/router/evalstream/router/bad.py:1: imports evalstream.worker.grading (service router imports service worker)",
    ]


def test_the_checker_resolves_relative_imports_and_import_module(tmp_path: Path) -> None:
    plant(
        tmp_path, "services/router/evalstream/router/ok.py", "from . import routing\nfrom .fleet import x\n"
    )
    plant(tmp_path, "services/router/evalstream/router/sub/ok.py", "from ..policy import y\n")
    assert violations(tmp_path) == []
    plant(tmp_path, "services/router/evalstream/router/bad.py", "from ..worker import runner\n")
    plant(tmp_path, "services/router/evalstream/router/bad2.py", "from .. import worker\n")
    plant(
        tmp_path,
        "libs/common/evalstream/common/bad.py",
        "import importlib\nimportlib.import_module('evalstream.aggregator.store')\n",
    )
    assert sorted(str(v) for v in violations(tmp_path)) == [
        "libs/common/evalstream/common/bad.py:2: imports evalstream.aggregator.store (libs/common imports aggregator)",
        "services/router/evalstream/router/bad.py:1: imports evalstream.worker (service router imports service worker)",
        "services/router/evalstream/router/bad2.py:1: imports evalstream.worker (service router imports service worker)",
    ]


def test_the_checker_finds_cli_commands_importing_each_other(tmp_path: Path) -> None:
    plant(
        tmp_path,
        "cli/evalstream/cli/main.py",
        'COMMAND_MODULES: list[str] = ["evalstream.cli.a", "evalstream.cli.b"]\n',
    )
    plant(tmp_path, "cli/evalstream/cli/a.py", "from evalstream.cli.common import fail\n")
    assert violations(tmp_path) == []
    plant(tmp_path, "cli/evalstream/cli/b.py", "from evalstream.cli.a import run\nfrom . import a\n")
    assert [str(v) for v in violations(tmp_path)] == [
        "cli/evalstream/cli/b.py:1: imports evalstream.cli.a (a CLI module imports a CLI command)",
        "cli/evalstream/cli/b.py:2: imports evalstream.cli.a (a CLI module imports a CLI command)",
    ]


def test_the_checker_finds_a_new_top_level_package(tmp_path: Path) -> None:
    plant(tmp_path, "services/scheduler/evalstream/scheduler/app.py", "import json\n")
    plant(tmp_path, "cli/evalstream/cli/x.py", "from evalstream.analysis import queries\n")
    assert sorted(str(v) for v in violations(tmp_path)) == [
        "cli/evalstream/cli/x.py:1: imports evalstream.analysis (evalstream.analysis is no known component)",
        "services/scheduler/evalstream/scheduler/app.py:1: imports evalstream.scheduler (no known component)",
    ]


def test_the_checker_finds_result_table_sql_outside_the_query_module(tmp_path: Path) -> None:
    plant(tmp_path, "libs/common/evalstream/common/analysis/queries.py", 'Q = "SELECT * FROM runs"\n')
    plant(
        tmp_path,
        "cli/evalstream/cli/ok.py",
        'Q = "SELECT * FROM dataset_versions"\nH = "runs in SELECT order"\n',
    )
    assert sql_on_result_tables(tmp_path) == []
    plant(
        tmp_path,
        "cli/evalstream/cli/bad.py",
        """
        async def f(conn, cols):
            await conn.fetch(f"SELECT {cols} FROM item_results WHERE run_id = $1")
            await conn.execute(
                "UPDATE runs SET status = 'x'"
            )
        """,
    )
    plant(tmp_path, "services/router/evalstream/router/bad.py", 'Q = """\n  delete from item_results"""\n')
    assert sql_on_result_tables(tmp_path) == [
        "cli/evalstream/cli/bad.py:3",
        "cli/evalstream/cli/bad.py:5",
        "services/router/evalstream/router/bad.py:1",
    ]
