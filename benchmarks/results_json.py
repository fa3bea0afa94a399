"""One JSON file of figures that several benchmark processes add to, one key each (benchmarks/gpu_check.sh).

    python benchmarks/results_json.py PATH KEY 'JSON VALUE'                    # sets KEY
    python benchmarks/results_json.py PATH --step NAME RC SECONDS LIMIT SUMMARY  # appends to "steps"

No torch import: the GPU check calls it after every step, and it must cost nothing.
"""
from __future__ import annotations

import json
import math
import os
import sys


def _finite(value):
    """NaN and Inf (a peer that failed) as null: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def record(path: str | None, key: str, value) -> None:
    """Sets `key` to `value` in the JSON object at `path` (created if missing); nothing when path is None.

    Written to a temporary file and renamed, so a step killed mid-write leaves the previous figures intact.
    """
    if not path:
        return
    try:
        with open(path) as f:
            figures = json.load(f)
    except (OSError, ValueError):
        figures = {}
    figures[key] = _finite(value)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(figures, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def record_step(path: str, name: str, rc: int, seconds: int, limit_s: int, summary: str) -> None:
    """Appends one step's outcome (exit status, seconds taken, its time limit, its last summary line) to "steps"."""
    try:
        with open(path) as f:
            steps = json.load(f).get("steps", [])
    except (OSError, ValueError):
        steps = []
    steps.append({"step": name, "rc": rc, "seconds": seconds, "limit_s": limit_s, "summary": summary})
    record(path, "steps", steps)


def main(argv: list[str]) -> None:
    if len(argv) == 7 and argv[1] == "--step":
        path, _, name, rc, seconds, limit_s, summary = argv
        record_step(path, name, int(rc), int(seconds), int(limit_s), summary)
    elif len(argv) == 3:
        path, key, value = argv
        record(path, key, json.loads(value))
    else:
        raise SystemExit("usage: results_json.py PATH KEY 'JSON VALUE' | PATH --step NAME RC SECONDS LIMIT SUMMARY")


if __name__ == "__main__":
    main(sys.argv[1:])
