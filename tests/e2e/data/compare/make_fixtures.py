#!/usr/bin/python3
"""Writes the fixture files of tests/e2e/test_compare.py (deterministic: fixed seeds).

usage: make_fixtures.py [DIR]   (default: the folder of this script)

Reports follow the "samples" section of docs/scenario-extensions.md: per metric, one list of
values per repetition (the first `warmup` of them warm-up). Timings are drawn around fixed
medians with a few percent of noise; "slow" adds a stall of 30% to the repeat cycle of
quickstart (an injected slowdown), "same" draws again from the baseline's distribution.
"""
import json
import os
import random
import sys

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))

METRICS = {  # metric: median seconds
    "fresh_bind": 310e-6,
    "reused_bind": 12e-6,
    "close": 45e-6,
    "exchange": 8e-6,
    "collective/recycle": 20e-6,
    "repeat/cycle": 95e-6,
}


def report(scenario, seed, repetitions, warmup, slow=None, world=2):
    rng = random.Random(seed)
    metrics = {}
    for metric, center in METRICS.items():
        factor = (slow or {}).get(metric, 1.0)
        per_rep = []
        for rep in range(repetitions):
            warm = 1.5 if rep < warmup else 1.0  # warm-up repetitions are slower
            per_rep.append([round(center * factor * warm * rng.uniform(0.97, 1.03), 9)
                            for _ in range(world)])
        metrics[metric] = {"unit": "s", "per_repetition": per_rep}
    return {"format": "hmc-report/1", "scenario": scenario, "outcome": "pass",
            "samples": {"repetitions": repetitions, "warmup": warmup, "metrics": metrics}}


def report_set(reports):
    return {"format": "hmc-report-set/1", "reports": reports}


def gbench(seed, slow=1.0, repetitions=6, aggregates=True):
    rng = random.Random(seed)
    rows = []
    for name, center in [("BM_ThreadsExchange/256", 2.0e5), ("BM_FirstBindRecycle", 4.0e4)]:
        factor = slow if name == "BM_FirstBindRecycle" else 1.0
        times = [center * factor * rng.uniform(0.97, 1.03) for _ in range(repetitions)]
        for index, t in enumerate(times):
            rows.append({"name": name, "run_name": name, "run_type": "iteration",
                         "repetitions": repetitions, "repetition_index": index, "threads": 1,
                         "iterations": 100, "real_time": t, "cpu_time": t * 0.9,
                         "time_unit": "ns"})
        if aggregates:
            mean = sum(times) / len(times)
            rows.append({"name": name + "_mean", "run_name": name, "run_type": "aggregate",
                         "repetitions": repetitions, "aggregate_name": "mean",
                         "real_time": mean, "cpu_time": mean, "time_unit": "ns"})
    return {"context": {"date": "2026-12-01T00:00:00+00:00", "num_cpus": 2},
            "benchmarks": rows}


def write(name, document):
    with open(os.path.join(OUT, name), "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


write("baseline.json", report_set([report("quickstart", 1, 6, 1), report("reuse-churn", 2, 6, 1)]))
write("same.json", report_set([report("quickstart", 3, 6, 1), report("reuse-churn", 4, 6, 1)]))
write("slow.json", report_set([report("quickstart", 5, 6, 1, slow={"repeat/cycle": 1.3}),
                               report("reuse-churn", 6, 6, 1)]))
write("single-quickstart.json", report("quickstart", 7, 6, 1))
write("few-samples.json", report_set([report("quickstart", 8, 3, 1), report("reuse-churn", 9, 3, 1)]))
write("other-scenario.json", report("multi-group", 10, 6, 1))
write("unknown-format.json", {"format": "something-else/1", "values": [1, 2, 3]})
write("gbench-baseline.json", gbench(11))
write("gbench-same.json", gbench(12))
write("gbench-slow.json", gbench(13, slow=1.25))
aggregates_only = gbench(14)
aggregates_only["benchmarks"] = [r for r in aggregates_only["benchmarks"]
                                 if r["run_type"] == "aggregate"]
write("gbench-aggregates-only.json", aggregates_only)
