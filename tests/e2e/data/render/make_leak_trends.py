#!/usr/bin/python3
"""Writes leak-trends.json here: a real hmc-run report with a hand-built `leak_trends` section.

usage: make_leak_trends.py REPORT.json

REPORT.json: `hmc-run scenarios/quickstart.json --world-size 4 --report REPORT.json`. The
section follows the shape the leak-trend engineer agreed on (docs/html.md, "Leak trends"): 200
cycles, 20 of warm-up, one series per rank and metric plus the process as a whole (rank null),
values with seeded noise; rank 2's open descriptors grow 0.1 per cycle (a leak), the others are
flat, and one series has too few cycles. Until hmc-run writes the section itself, this file is
what tests/e2e/test_html.py draws through `hmc-run render`.
"""
import json
import os
import random
import sys

rng = random.Random(20)
report = json.load(open(sys.argv[1]))
cycles, warmup = 200, 20


def fit(values):
    xs = list(range(warmup, len(values)))
    ys = values[warmup:]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    residual = sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys)) / (len(xs) - 2)
    half = 2.6 * (residual / sxx) ** 0.5  # ~99% for ~180 points
    return slope, slope - half, slope + half, my - slope * mx


def series(rank, metric, title, unit, base, growth, noise, threshold, n=cycles):
    values = [base + growth * c + rng.gauss(0, noise) for c in range(n)]
    if unit == "count":
        values = [round(v) for v in values]
    who = "process" if rank is None else f"rank {rank}"
    if n <= warmup + 2:
        return {"rank": rank, "host": report["environment"]["host"], "metric": metric,
                "title": title, "unit": unit, "cycle_stride": 1, "values": values,
                "slope_per_cycle": None, "ci_low": None, "ci_high": None, "intercept": None,
                "threshold_per_cycle": threshold, "verdict": "too_few_cycles",
                "text": f"{who}: {title}: {n} cycles, too few to fit after {warmup} of warm-up"}
    slope, low, high, intercept = fit(values)
    leak = low > threshold
    unit_text = "" if unit == "count" else " B"
    verdict = "leak" if leak else "flat"
    text = (f"{who}: {title} {'grow' if leak else 'change'} {slope:.3f}{unit_text} per cycle "
            f"(99% CI {low:.3f} to {high:.3f}) over {n} cycles: {verdict}")
    return {"rank": rank, "host": report["environment"]["host"], "metric": metric, "title": title,
            "unit": unit, "cycle_stride": 1, "values": values, "slope_per_cycle": slope,
            "ci_low": low, "ci_high": high, "intercept": intercept,
            "threshold_per_cycle": threshold, "verdict": verdict, "text": text}


all_series = [series(None, "rss_bytes", "resident memory", "bytes", 180e6, 0, 3e5, 4096)]
for rank in range(report["world_size"]):
    growth = 0.1 if rank == 2 else 0.0
    all_series.append(series(rank, "open_descriptors", "open descriptors", "count", 40,
                             growth, 1.0, 0.05))
all_series.append(series(3, "threads", "threads", "count", 9, 0, 0.2, 0.05, n=15))
report["leak_trends"] = {"cycles": cycles, "warmup": warmup, "confidence": 0.99,
                         "series": all_series,
                         "leaks": [s["text"] for s in all_series if s["verdict"] == "leak"]}
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "leak-trends.json")
with open(out, "w") as fh:
    json.dump(report, fh, indent=1, sort_keys=True)
    fh.write("\n")
print(out)
