"""What the doc generators (gen_*.py) share: reading a record of benchmarks/results/, and writing
the generated pages or, with ``--check``, saying which are out of date."""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def load_record(name: str, results: str = RESULTS):
    """The JSON record ``results/name`` (None where it was never written)."""
    path = os.path.join(results, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def write_or_check(outputs: dict, check: bool, script: str) -> int:
    """Write each ``path -> text`` of ``outputs``; with ``check``, write nothing and return 1 (naming
    ``script`` to run) where a file is not that text."""
    if check:
        stale = [os.path.relpath(path, ROOT) for path, text in outputs.items()
                 if (open(path).read() if os.path.exists(path) else "") != text]
        if stale:
            print(f"{' and '.join(stale)} out of date: run python {script}", file=sys.stderr)
            return 1
        return 0
    for path, text in outputs.items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {os.path.relpath(path, ROOT)}")
    return 0
