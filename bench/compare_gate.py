#!/usr/bin/python3
"""How often `hmc-run compare` cries wolf, and how often it catches a 10% regression (issue 55).

usage: bench/compare_gate.py [--hmc-run build/app/hmc-run] [--pairs N] [--mode ab|files]
                             [--conditions idle,busy,regression] [--seed S] [options below]

The workload is the issue's: a labelled `repeat` of drop, create, forward (features 384) 20
times on 2 thread ranks. Conditions, each --pairs comparisons:

  idle        unchanged: the same build against itself
  busy        unchanged, beside a busy loop (`yes > /dev/null`) for the whole condition
  regression  the candidate's labelled cycle made --regression (10%) slower by a `sleep` step
              in the cycle, calibrated first against the measured cycle (the sleep is
              adjusted until cycle(slow) / cycle(base) reads 1.10 over alternating runs)

Modes: `ab` (default) runs `hmc-run compare --ab OLD NEW scenario.json` per pair (the candidate
of a regression pair is a wrapper program that runs the slowed scenario); `files` runs the
scenario twice (`--repetitions`, default 12) one after the other and compares the two reports.
Idle and regression pairs are interleaved in a seeded order, so both see the same machine; the
busy pairs run as one block with the busy loop on.

The hmc-run programs are copied to a temporary folder first, so that rebuilding the tree while
this runs does not change what is measured. Standard library only; prints `# ` lines while it
runs and one summary table at the end, with the command line (Ctrl-C prints the table of the
pairs done so far). Exit 0 (it measures, it does not judge).
"""
import argparse
import json
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def cycle_steps(extra):
    """Ten cycles of drop, create, forward; in `extra` of them one more forward of module w
    (batch 1): work of the same kind as the cycle's own (hmc's forward bookkeeping and the
    matmul), so it stays about the same share of the cycle when the machine gets slower or
    faster (a sleep would not). The labelled repeat runs this block twice: 20 cycles."""
    steps = []
    for k in range(10):
        steps += [{"op": "drop", "module": "m"},
                  {"op": "create", "module": "m", "features": 384},
                  {"op": "forward", "module": "m"}]
        if k < extra:
            steps.append({"op": "forward", "module": "w", "batch": 1})
    return steps


def scenario(extra=0):
    return {"format": "hmc-scenario/1", "name": "gate", "world_size": 2, "device": "cpu",
            "timeout_s": 60, "leak_trend": "any",
            "description": "issue 55's gate workload: a labelled cycle of drop, create, forward",
            "steps": [{"op": "create", "module": "m", "features": 384},
                      {"op": "create", "module": "w", "features": 384},
                      {"op": "forward", "module": "m"},
                      {"op": "forward", "module": "w"},
                      {"op": "repeat", "count": 2, "label": "cycle", "steps": cycle_steps(extra)},
                      {"op": "close_all"}]}


def write_json(path, document):
    with open(path, "w") as fh:
        json.dump(document, fh)
    return path


def run(argv, timeout=900):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def calibration_scenario(extra):
    """Base and slowed blocks in one process, alternating: their ratio is read at the same
    moment of the machine, so it calibrates the extra work even on a noisy host."""
    doc = scenario()
    blocks = []
    for _ in range(4):
        blocks.append({"op": "repeat", "count": 1, "label": "base", "steps": cycle_steps(0)})
        blocks.append({"op": "repeat", "count": 1, "label": "slow", "steps": cycle_steps(extra)})
    doc["steps"][4:5] = blocks
    return doc


def measure_ratio(hmc_run, work, extra, runs):
    path = os.path.join(work, "calibration.json")
    report = os.path.join(work, "calibration-report.json")
    ratios, bases = [], []
    for _ in range(runs):
        write_json(path, calibration_scenario(extra))
        proc = run([hmc_run, path, "--repetitions", "12", "--report", report])
        if proc.returncode != 0:
            sys.exit(f"compare_gate: calibration run exited {proc.returncode}:\n"
                     f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        with open(report) as fh:
            samples = json.load(fh)["samples"]
        metrics, warm = samples["metrics"], samples["warmup"]
        for b, sl in zip(metrics["repeat/base"]["per_repetition"][warm:],
                         metrics["repeat/slow"]["per_repetition"][warm:]):
            bases.append(statistics.median(b) / 10)
            ratios.append(statistics.median(sl) / statistics.median(b))
    return statistics.median(bases), statistics.median(ratios), len(ratios)


def calibrate(hmc_run, work, target, runs):
    """How many of each 10 cycles get the extra forward for the cycle to be `target` (0.10)
    slower: the share of one extra forward measured with all 10, then the count that comes
    closest, measured again (slow / base over `runs` runs of 12 repetitions each)."""
    cycle, ratio, n = measure_ratio(hmc_run, work, 10, runs)
    share = (ratio - 1) / 10
    print(f"# calibration: cycle {cycle * 1e3:.3f} ms, one extra forward per cycle -> slow/base "
          f"{ratio:.4f} over {n} repetitions: {100 * share:.2f}% per extra forward in 10 cycles",
          flush=True)
    extra = min(10, max(1, round(target / share)))
    cycle, ratio, n = measure_ratio(hmc_run, work, extra, runs)
    print(f"# calibration: cycle {cycle * 1e3:.3f} ms, {extra} extra forwards per 10 cycles -> "
          f"slow/base {ratio:.4f} over {n} repetitions", flush=True)
    return extra, cycle, ratio


def wilson(k, n, z=1.96):
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def one_pair(args, hmc_run, work, candidate_scenario, candidate_program, index):
    base = os.path.join(work, "base.json")
    gate = ["--max-regression", args.max_regression, "--json"]
    if args.mode == "ab":
        argv = [hmc_run, "compare", "--ab", hmc_run, candidate_program, base,
                "--rounds", str(args.rounds), "--round-repetitions", str(args.round_repetitions),
                *gate]
    else:
        a = os.path.join(work, f"a{index}.json")
        b = os.path.join(work, f"b{index}.json")
        for path, scen in ((a, base), (b, candidate_scenario)):
            proc = run([hmc_run, scen, "--repetitions", str(args.repetitions), "--report", path])
            if proc.returncode != 0:
                return {"exit": -1, "why": (proc.stdout + proc.stderr)[-800:]}
        argv = [hmc_run, "compare", a, b, *gate]
    proc = run(argv)
    out = {"exit": proc.returncode}
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        out["why"] = proc.stderr[-800:]
        return out
    if proc.returncode not in (0, 1):
        out["why"] = proc.stderr[-800:]
    cycle = next((m for m in doc["metrics"] if m["name"] == "gate: repeat/cycle"), None)
    if cycle:
        out.update(verdict=cycle["verdict"], change=cycle.get("change"),
                   p=cycle.get("p_adjusted", cycle.get("p_value")),
                   needed=cycle.get("samples_needed"))
    out["inconclusive"] = len(doc.get("inconclusive", []))
    return out


def summarize(name, results):
    n = len(results)
    fails = sum(r["exit"] == 1 for r in results)
    bad = sum(r["exit"] not in (0, 1) for r in results)
    inconclusive = [r for r in results if r.get("inconclusive")]
    needed = sorted(r["needed"] for r in inconclusive if r.get("needed"))
    changes = sorted(r["change"] for r in results if r.get("change") is not None)
    low, high = wilson(fails, n)
    line = (f"{name:<11} {n:>5}  {fails:>4} ({100 * fails / max(n, 1):5.1f}%, 95% "
            f"{100 * low:4.1f}-{100 * high:5.1f}%)  {bad:>4}  {len(inconclusive):>4}")
    if needed:
        line += f" (asks {needed[0]}-{needed[-1]}, median {statistics.median(needed):.0f})"
    if changes:
        line += (f"  change of repeat/cycle: median {100 * statistics.median(changes):+.1f}%, "
                 f"range {100 * changes[0]:+.1f}%..{100 * changes[-1]:+.1f}%")
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hmc-run", default=os.path.join(REPO, "build", "app", "hmc-run"))
    parser.add_argument("--pairs", type=int, default=200, help="comparisons per condition")
    parser.add_argument("--mode", choices=("ab", "files"), default="ab")
    parser.add_argument("--conditions", default="idle,busy,regression")
    parser.add_argument("--seed", type=int, default=55)
    parser.add_argument("--regression", type=float, default=0.10,
                        help="the seeded slowdown of the labelled cycle (0.10: 10%%)")
    parser.add_argument("--max-regression", default="5%",
                        help="compare's --max-regression (a 10%% regression must exceed it)")
    parser.add_argument("--rounds", type=int, default=10, help="ab: compare --rounds")
    parser.add_argument("--round-repetitions", type=int, default=6,
                        help="ab: compare --round-repetitions")
    parser.add_argument("--repetitions", type=int, default=12, help="files: hmc-run --repetitions")
    parser.add_argument("--calibration-runs", type=int, default=2)
    parser.add_argument("--json", help="also write every pair's result here")
    args = parser.parse_args()
    conditions = [c for c in args.conditions.split(",") if c]
    for c in conditions:
        if c not in ("idle", "busy", "regression"):
            parser.error(f"unknown condition {c!r}: idle, busy or regression")

    work = tempfile.mkdtemp(prefix="hmc-compare-gate-")
    source = os.path.dirname(os.path.abspath(args.hmc_run))
    for name in ("hmc-run", "hmc-run-torch"):
        if os.path.exists(os.path.join(source, name)):
            shutil.copy2(os.path.join(source, name), os.path.join(work, name))
    hmc_run = os.path.join(work, "hmc-run")
    write_json(os.path.join(work, "base.json"), scenario())
    command = " ".join(shlex.quote(a) for a in sys.argv)
    print(f"# {command}", flush=True)
    print(f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start; work in {work}",
          flush=True)
    started = time.monotonic()

    slow_path = os.path.join(work, "slow.json")
    wrapper = os.path.join(work, "hmc-run-slower")
    calibration = None
    if "regression" in conditions:
        calibration = calibrate(hmc_run, work, args.regression, args.calibration_runs)
        write_json(slow_path, scenario(calibration[0]))
        with open(wrapper, "w") as fh:  # a "build" whose labelled cycle is 10% slower
            fh.write(f"#!/bin/sh\nshift\nexec {shlex.quote(hmc_run)} {shlex.quote(slow_path)} "
                     "\"$@\"\n")
        os.chmod(wrapper, 0o755)

    rng = random.Random(args.seed)
    quiet = [c for c in conditions if c != "busy"]
    schedule = [c for c in quiet for _ in range(args.pairs)]
    rng.shuffle(schedule)
    if "busy" in conditions:
        schedule += ["busy"] * args.pairs
    results = {c: [] for c in conditions}
    busy = None
    try:
        for index, condition in enumerate(schedule):
            if condition == "busy" and busy is None:
                busy = subprocess.Popen(["yes"], stdout=subprocess.DEVNULL)
                print(f"# busy loop started (pid {busy.pid})", flush=True)
            slower = condition == "regression"
            result = one_pair(args, hmc_run, work,
                              slow_path if slower else os.path.join(work, "base.json"),
                              wrapper if slower else hmc_run, index)
            results[condition].append(result)
            print(f"# pair {index + 1}/{len(schedule)} {condition}: exit {result['exit']}, "
                  f"cycle {result.get('verdict', '?')} {100 * (result.get('change') or 0):+.1f}%"
                  f" p {result.get('p') if result.get('p') is not None else float('nan'):.4f}"
                  f" ({time.monotonic() - started:.0f} s)", flush=True)
    except KeyboardInterrupt:  # Ctrl-C: the figures of the pairs done so far
        print(f"# interrupted after {sum(len(r) for r in results.values())} pairs", flush=True)
    finally:
        if busy is not None:
            busy.terminate()
            busy.wait()

    print(f"# {command}")
    what = (f"compare --ab, {args.rounds} rounds x --repetitions {args.round_repetitions}"
            if args.mode == "ab" else f"two files, --repetitions {args.repetitions} each")
    print(f"# mode {args.mode} ({what}), --max-regression {args.max_regression}, seed {args.seed}, "
          f"{time.monotonic() - started:.0f} s")
    if calibration:
        extra, cycle, ratio = calibration
        print(f"# seeded regression: {extra} extra forwards (batch 1) per 10 cycles of "
              f"{cycle * 1e3:.3f} ms: slow/base {ratio:.4f} in the calibration (base and slow "
              "cycles alternating in one process)")
    print("condition   pairs  exit 1 (rate, Wilson 95%)      exit 2  inconclusive")
    for condition in conditions:
        print(summarize(condition, results[condition]))
    if args.json:
        write_json(args.json, {"command": command, "results": results,
                               "calibration": calibration})
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
