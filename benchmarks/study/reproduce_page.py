"""reproduce_page: the results page (docs/results.md) written from the reproduce_<part>.json files of a folder.

Per part: the claim in a sentence, the runs' settings, the table, the plot, the criterion and the
verdict with its reasons, all read from the JSON (nothing here decides a verdict).
"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
from common import HERE

RESULTS = os.path.join(HERE, "results")
REAL_RECORDS = ("overlap_accuracy", "overlap_throughput", "overlap_budget", "compensation_delay",
                "compensation_hetero", "scaling_scaling")  # the real runs the parts' real checks read
ORDER = ("odsgd", "compensation", "compensation_teacher", "scaling", "scaling_teacher", "hetero", "hpsgd")
MARK = {"reproduced": "**reproduced**", "partly": "**partly reproduced**", "not": "**not reproduced**"}


def _load(out: str):
    parts = {}
    for path in glob.glob(os.path.join(out, "reproduce_*.json")):
        with open(path) as f:
            summary = json.load(f)
        parts[summary["part"]] = (summary, os.path.splitext(path)[0] + ".png")
    return [parts[p] for p in sorted(parts, key=lambda p: (ORDER.index(p) if p in ORDER else len(ORDER), p))]


def _table(columns, rows) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _value(v) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v))
    if isinstance(v, dict):
        return "; ".join(f"{k} ({_value(x)})" for k, x in v.items())
    return str(v)


def _settings(settings: dict) -> str:
    return "; ".join(f"{k}: {_value(v)}" for k, v in settings.items())


def _section(summary: dict, image: str, page_dir: str) -> str:
    seconds = summary.get("real_seconds")
    out = [f"## {summary['title']}", "",
           f"**Claim.** {summary['claim']}", "",
           f"**Runs** ({len(summary['runs'])} simulated, time base `{summary['time_base']}`"
           + (f", {seconds:.0f} real seconds" if seconds is not None else "") + f"). {_settings(summary['settings'])}.",
           "", _table(summary["table"]["columns"], summary["table"]["rows"]), "",
           f"![{summary['part']}]({os.path.relpath(image, page_dir)})", "",
           f"**Criterion.** {summary['criterion']}", "",
           f"**Verdict:** {MARK[summary['verdict']]}.", ""]
    out += [f"- {c.get('source', 'simulated')}: {c['claim']}: **{c['verdict']}** ({c['why']})."
            for c in summary["claims"]]
    out.append("")
    if summary.get("note"):
        out += [summary["note"], ""]
    if summary.get("earlier_real_runs"):
        out += ["Earlier real runs (`hvd-async train` under mpirun on the shared 2-core machine, "
                "benchmarks/results/):", ""]
        out += [f"- {name}: `{json.dumps(value)}`" for name, value in summary["earlier_real_runs"].items()]
        out.append("")
    return "\n".join(out)


def _commits(parts) -> str:
    """Which commit each simulated part and each real record (benchmarks/results/, where the real checks read
    them) came from, and whether its tree was clean."""
    def word(prov):
        return "no provenance" if not prov else (f"{str(prov['commit'])[:7]}"
                                                 + ("" if prov.get("tree_clean") else " (tree not clean)"))

    sim = sorted({word(s.get("provenance")) for s, _ in parts})
    real = []
    for name in REAL_RECORDS:
        path = os.path.join(RESULTS, f"{name}.json")
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            real.append(f"{name}.json {word(record.get('provenance'))}")
    return (f"Commits: the simulated parts {', '.join(sim)}; the real records "
            + (", ".join(real) if real else "none found") + ".")


def write_page(out: str, page: str, *, quick: bool = False) -> str:
    """Write the page for every reproduce_<part>.json in ``out`` to ``page``; returns its text."""
    parts = _load(out)
    page_dir = os.path.dirname(os.path.abspath(page))
    head = ["# Reproduction study: the papers' claims, measured", "",
            "Written by `python benchmarks/study/reproduce.py`" + (" --quick (reduced CI version)" if quick else "")
            + " from `reproduce_<part>.json`; rerun it to regenerate this page. Every run here is the delay "
            "simulator (`hvd-async simulate`: the real strategies, rules and server programs over simulated "
            "transports, on a virtual clock; deterministic for a seed) training an MLP on scikit-learn's 8x8 "
            "digits (1,437 training and 360 test images) or, in the parts marked teacher, on the seeded "
            "teacher task (`--dataset teacher`: 24,000 training and 4,000 test 16x16 images labelled by a "
            "fixed random network, made in memory), so times are **simulated "
            "seconds**: compute per step drawn from the stated distribution, a fixed latency per exchange, "
            "no server compute time and no contention for cores. Every algorithm runs with its defaults at "
            "the library commit each part's JSON records (`hvd-async train --help`: push rate average, "
            "dc-asgd's adaptive lam 2.0, the look-ahead on; lc-asgd's lam in the compensation parts' settings "
            "line) unless its settings line says "
            "otherwise (the compensation parts: push rate full, momentum 0). Claims about real wall-clock speed are "
            "checked against the real runs in `benchmarks/results/`, cited with their numbers, and a real "
            "check that fails makes the part at most partly reproduced. Numbers are means over five seeds with "
            "[min-max]; the real checks' records hold five seeds or repeats each, given with their spread; every "
            "check uses one margin, 1 point of test accuracy (3.6 of digits' 360 test images), and is the code of "
            "the commit its runs record, committed before they ran. A run whose mean training loss left the finite "
            "range or passed twice the chance-level loss stopped as diverged and scores chance accuracy.", "",
            _commits(parts), "", "| claim | verdict |", "|---|---|"]
    head += [f"| [{s['title']}](#{_anchor(s['title'])}) | {s['verdict']} |" for s, _ in parts]
    text = "\n".join(head + [""] + [_section(s, img, page_dir) for s, img in parts])
    os.makedirs(page_dir, exist_ok=True)
    with open(page, "w") as f:
        f.write(text)
    return text


def _anchor(title: str) -> str:
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")
