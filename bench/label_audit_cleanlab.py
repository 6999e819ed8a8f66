"""Run by bench/label_audit.py inside bench/.venv-cleanlab (cleanlab is not a project
dependency): confident learning on the multiple-choice items of each grid cell.

stdin: {"cells": [{"labels": [gold letter index, ...], "pred_probs": [[p(A), p(B), ...], ...]}]}
stdout: {"cleanlab": VERSION, "cells": [{"issues": [bool, ...], "scores": [1 - label quality, ...]}]}
"""

from __future__ import annotations

import json
import sys

import cleanlab
import numpy as np
from cleanlab.filter import find_label_issues
from cleanlab.rank import get_label_quality_scores


def main() -> None:
    request = json.load(sys.stdin)
    out = []
    for cell in request["cells"]:
        labels = np.asarray(cell["labels"], dtype=int)
        pred_probs = np.asarray(cell["pred_probs"], dtype=float)
        issues = find_label_issues(labels, pred_probs)
        quality = get_label_quality_scores(labels, pred_probs)
        out.append({"issues": [bool(x) for x in issues], "scores": [float(1 - q) for q in quality]})
    json.dump({"cleanlab": cleanlab.__version__, "cells": out}, sys.stdout)


if __name__ == "__main__":
    main()
