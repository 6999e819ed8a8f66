"""The architecture's import boundaries, read from the source (ast, nothing imported):

* no service imports another service (producer, router, worker, aggregator);
* the shared library (libs/common) imports no service and not the CLI;
* the CLI imports no service: it is a client of the services' topics and tables;
* only the worker imports torch, OpenVINO or pynvml (the other images do not install them).

Every import counts, function-local ones and those under `try: ... except ImportError` too:
an import that may fail in one image is still a dependency on another component's code.
"""

from __future__ import annotations

import ast
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


def imported_modules(source: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement, at any depth."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)]
            # `from evalstream import worker` names a component too
            out += [
                (node.lineno, f"{node.module}.{a.name}") for a in node.names if node.module == "evalstream"
            ]
    return out


def rule_broken(owner: str, module: str) -> str | None:
    """Why `owner` (a component) may not import `module`, or None."""
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
    return None


def violations(root: Path) -> list[Violation]:
    found = []
    for top in CHECKED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            owner = component(rel)
            if owner is None:
                continue
            for line, module in imported_modules(path.read_text(encoding="utf-8")):
                if rule := rule_broken(owner, module):
                    found.append(Violation(rel.as_posix(), line, module, rule))
    return found


def test_no_import_crosses_a_boundary() -> None:
    found = violations(ROOT)
    new = [str(v) for v in found if (v.path, v.module) not in KNOWN]
    assert new == [], "imports across component boundaries:\n" + "\n".join(new)
    stale = sorted(set(KNOWN) - {(v.path, v.module) for v in found})
    assert stale == [], f"KNOWN lists imports that are gone: remove {stale}"


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
