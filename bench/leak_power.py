#!/usr/bin/python3
"""The leak-trend check's false-alarm rate and power, measured (docs/leak-trends.md).

usage: bench/leak_power.py HMC_RUN [--runs 100] [--cycles 50,200] [--sizes 4096,16384,...]
                           [--transport threads] [--resource memory|mapped]

Each measurement runs one hmc-run over a folder of `--runs` copies of one scenario (one
process; every copy is its own run of `cycles` repetitions with its own fit), and counts the
copies whose report finds a leak across cycles:
- clean: the scenario's cycle alone (create, forward, close_all on 2 ranks): every leak found
  is a false alarm;
- memory B: the same cycle plus a `leak` fault keeping B bytes on rank 0 each cycle (from the
  C allocator, or with `--resource mapped` pages of its own mmap, which the heap in use does
  not see): every copy with a leak of resident memory found is a detection.
Columns: runs with a leak of any metric; of resident memory; of resident memory in use
(resident memory less the allocator's free bins); of the heap in use; the median slopes.
Prints a table and one JSON line per measurement. Standard library only.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

CYCLE = [
    {"op": "create", "module": "a", "features": 16},
    {"op": "forward", "module": "a", "batch": 2},
    {"op": "close_all"},
]


def measure(hmc_run, runs, cycles, leak_bytes, transport, resource):
    folder = tempfile.mkdtemp(prefix="hmc-leak-power-")
    try:
        steps = list(CYCLE)
        if leak_bytes:
            steps.append({"op": "fault", "kind": "leak", "resource": resource,
                          "bytes": leak_bytes, "ranks": [0]})
        for i in range(runs):
            with open(os.path.join(folder, f"run-{i:04d}.json"), "w") as f:
                json.dump({"format": "hmc-scenario/1", "name": f"run-{i:04d}", "world_size": 2,
                           "device": "cpu", "timeout_s": 60, "leak_trend": "any",
                           "steps": steps}, f)
        report = os.path.join(folder, "report.json")
        began = time.monotonic()
        proc = subprocess.run([hmc_run, folder, "--repetitions", str(cycles), "--report", report,
                               "--transport", transport, "--quiet"],
                              capture_output=True, text=True)
        seconds = time.monotonic() - began
        if proc.returncode != 0:
            sys.exit(f"hmc-run failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                     f"{proc.stderr[-2000:]}")
        with open(report) as f:
            doc = json.load(f)
        reports = doc["reports"] if "reports" in doc else [doc]
        flagged = 0
        resident = 0
        heap = 0
        used = 0
        slopes = []
        heap_slopes = []
        used_slopes = []
        for r in reports:
            leaks = r["leak_trends"]["series"]
            if any(s["verdict"] == "leak" for s in leaks):
                flagged += 1
            for s in leaks:
                if s["metric"] == "resident_bytes" and s["slope_per_cycle"] is not None:
                    slopes.append(s["slope_per_cycle"])
                    if s["verdict"] == "leak":
                        resident += 1
                if s["metric"] == "resident_used_bytes" and s["slope_per_cycle"] is not None:
                    used_slopes.append(s["slope_per_cycle"])
                    if s["verdict"] == "leak":
                        used += 1
                if s["metric"] == "heap_bytes" and s["slope_per_cycle"] is not None:
                    heap_slopes.append(s["slope_per_cycle"])
                    if s["verdict"] == "leak":
                        heap += 1
        slopes.sort()
        heap_slopes.sort()
        used_slopes.sort()
        return {"cycles": cycles, "leak_bytes": leak_bytes, "resource": resource,
                "runs": len(reports), "flagged": flagged, "resident_leaks": resident,
                "resident_used_leaks": used, "heap_leaks": heap,
                "slope_median": slopes[len(slopes) // 2] if slopes else None,
                "used_slope_median": used_slopes[len(used_slopes) // 2] if used_slopes else None,
                "heap_slope_median": heap_slopes[len(heap_slopes) // 2] if heap_slopes else None,
                "seconds": round(seconds, 1), "transport": transport}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("hmc_run")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--cycles", default="50,200")
    parser.add_argument("--sizes", default="0,2048,4096,8192,32768,131072")
    parser.add_argument("--transport", default="threads")
    parser.add_argument("--resource", default="memory", choices=["memory", "mapped"])
    args = parser.parse_args()
    print(f"# {args.runs} runs each, transport {args.transport}, 2 ranks, leaks of "
          f"{args.resource}; a run is flagged when any metric of it is a leak")
    print(f"# {'cycles':>6}  {'leak/cycle':>10}  {'flagged':>9}  {'rss leak':>9}  "
          f"{'used leak':>9}  {'heap leak':>9}  {'rss slope':>10}  {'used slope':>10}  "
          f"{'heap slope':>10}  {'seconds':>7}")
    for cycles in (int(c) for c in args.cycles.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            m = measure(args.hmc_run, args.runs, cycles, size, args.transport, args.resource)

            def kib(value, digits):
                return "-" if value is None else f"{value / 1024:.{digits}f} KiB"

            print(f"  {cycles:>6}  {(str(size // 1024) + ' KiB') if size else 'none':>10}  "
                  f"{m['flagged']:>4}/{m['runs']:<4}  {m['resident_leaks']:>4}/{m['runs']:<4}  "
                  f"{m['resident_used_leaks']:>4}/{m['runs']:<4}  "
                  f"{m['heap_leaks']:>4}/{m['runs']:<4}  {kib(m['slope_median'], 1):>10}  "
                  f"{kib(m['used_slope_median'], 2):>10}  {kib(m['heap_slope_median'], 2):>10}  "
                  f"{m['seconds']:>7}", flush=True)
            print("# json " + json.dumps(m), flush=True)


if __name__ == "__main__":
    main()
