#!/usr/bin/python3
"""The cost of hmc::joinWorld's diagnostics in a user's program, side by side in one run.

    bench/embedding_cost.py build/examples/hmc-train-loop [--ranks 2] [--rounds 5]
                            [--steps 2000] [--features 64]

Runs the embedding example (examples/train_loop.cpp) under mpirun, alternating its two
worlds round by round so that both see the same machine: `--hand-assembled` (the transport
and a manager, as README's "Using libhmc" shows: no watchdog, heartbeats, flight recorder or
report) and hmc::joinWorld (all of them). Each run prints every rank's mean step time (a
fresh encoder and head, forward, backward: two recycles per step); the figure per run is
the slowest rank's. Prints both medians and their ratio, with the per-round ratios, and the
same as JSON with --json.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys


def run_once(example, ranks, steps, features, hand_assembled):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        sys.exit("embedding_cost: mpirun is not installed (scripts/setup installs openmpi-bin)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    command = [mpirun] + root + ["--oversubscribe", "-np", str(ranks), example,
                                 "--steps", str(steps), "--features", str(features)]
    if hand_assembled:
        command.append("--hand-assembled")
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        sys.exit(f"embedding_cost: {' '.join(command)} exited {done.returncode}:\n{text}")
    times = [float(m.group(1)) for m in re.finditer(r"step ([0-9.]+) us", text)]
    if len(times) != ranks:
        sys.exit(f"embedding_cost: expected {ranks} step times, found {len(times)}:\n{text}")
    return max(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("example")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    hand, world = [], []
    for round_ in range(args.rounds):
        # Alternate which goes first, so that a drift of the machine favours neither.
        order = [True, False] if round_ % 2 == 0 else [False, True]
        for hand_assembled in order:
            us = run_once(args.example, args.ranks, args.steps, args.features, hand_assembled)
            (hand if hand_assembled else world).append(us)
        print(f"# round {round_ + 1}/{args.rounds}: hand-assembled {hand[-1]:.1f} us, "
              f"joinWorld {world[-1]:.1f} us ({world[-1] / hand[-1]:.3f}x)", file=sys.stderr)
    ratio = statistics.median(world) / statistics.median(hand)
    result = {"ranks": args.ranks, "steps": args.steps, "features": args.features,
              "hand_assembled_us": hand, "join_world_us": world,
              "median_hand_assembled_us": statistics.median(hand),
              "median_join_world_us": statistics.median(world), "ratio": ratio,
              "round_ratios": [w / h for w, h in zip(world, hand)]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"step time, slowest of {args.ranks} ranks, median of {args.rounds} rounds: "
              f"hand-assembled {result['median_hand_assembled_us']:.1f} us, joinWorld "
              f"{result['median_join_world_us']:.1f} us: {ratio:.3f}x "
              f"({(ratio - 1) * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
