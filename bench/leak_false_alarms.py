#!/usr/bin/python3
"""The leak-trend check's false alarms over the bundled scenarios (docs/leak-trends.md).

usage: bench/leak_false_alarms.py HMC_RUN [--cycles 12,20,30,50,100,200] [--runs 5]
                                  [--transport threads] [--scenarios DIR]

Runs every scenario of DIR (default: the repository's scenarios/) `--runs` times with
`--repetitions N` for each N of `--cycles`, each run its own hmc-run (a fresh process, as a user
runs it), and reads each report's leak trends. None of these scenarios leaks, so every memory
series with the verdict `leak` is a false alarm. Prints, per number of cycles, for resident
memory, resident memory in use and the heap in use: the fitted series, the false alarms and the
largest slope, and one JSON line per number of cycles. Standard library only.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

METRICS = ("resident_bytes", "resident_used_bytes", "heap_bytes")


def run_once(hmc_run, path, cycles, transport, folder):
    report = os.path.join(folder, "report.json")
    if os.path.exists(report):
        os.unlink(report)
    proc = subprocess.run([hmc_run, path, "--repetitions", str(cycles), "--report", report,
                           "--quiet", "--transport", transport],
                          capture_output=True, text=True)
    if not os.path.exists(report):
        sys.exit(f"hmc-run wrote no report for {path} (exit {proc.returncode}):\n"
                 f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    with open(report) as f:
        return json.load(f)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hmc_run")
    parser.add_argument("--cycles", default="12,20,30,50,100,200")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--transport", default="threads")
    parser.add_argument("--scenarios", default=os.path.join(here, "..", "scenarios"))
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.scenarios, "*.json")))
    if not paths:
        sys.exit(f"no scenario in {args.scenarios}")
    print(f"# {len(paths)} scenarios, {args.runs} runs each, transport {args.transport}; per "
          "metric: false alarms / fitted series, largest slope")
    print(f"# {'cycles':>6}  " + "  ".join(f"{m:>32}" for m in METRICS) + f"  {'seconds':>7}")
    with tempfile.TemporaryDirectory(prefix="hmc-leak-false-alarms-") as folder:
        for cycles in (int(c) for c in args.cycles.split(",")):
            began = time.monotonic()
            fitted = {m: 0 for m in METRICS}
            alarms = {m: [] for m in METRICS}
            largest = {m: None for m in METRICS}
            for path in paths:
                for _ in range(args.runs):
                    doc = run_once(args.hmc_run, path, cycles, args.transport, folder)
                    for s in (doc.get("leak_trends") or {}).get("series", []):
                        m = s["metric"]
                        if m not in METRICS or s["slope_per_cycle"] is None:
                            continue
                        fitted[m] += 1
                        if largest[m] is None or s["slope_per_cycle"] > largest[m]:
                            largest[m] = s["slope_per_cycle"]
                        if s["verdict"] == "leak":
                            alarms[m].append(f"{os.path.basename(path)} rank {s['rank']}")
            seconds = round(time.monotonic() - began, 1)
            cells = []
            for m in METRICS:
                top = "-" if largest[m] is None else f"{largest[m] / 1024:.2f} KiB"
                cells.append(f"{len(alarms[m]):>4}/{fitted[m]:<4} {top:>12}")
            print(f"  {cycles:>6}  " + "  ".join(f"{c:>32}" for c in cells) + f"  {seconds:>7}",
                  flush=True)
            print("# json " + json.dumps({"cycles": cycles, "transport": args.transport,
                                          "runs": args.runs, "scenarios": len(paths),
                                          "fitted": fitted, "false_alarms": alarms,
                                          "largest_slope": largest, "seconds": seconds}),
                  flush=True)


if __name__ == "__main__":
    main()
