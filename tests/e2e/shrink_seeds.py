#!/usr/bin/python3
"""Failing scenarios buried in noise, for `hmc-run shrink` (tests/e2e/test_shrink.py and the
figures in docs/shrink.md). Standard library only.

usage: shrink_seeds.py KIND STEPS RANKS OUT.json
  KIND: skipped-close, divergent-signature, different-stages, crash, close-error-retry, leak
  STEPS: about how many top-level steps (the noise around the seeded failure)
  RANKS: world size (>= 2)

The noise is what long runs do: modules created, run (forward binds or recycles), dropped, and
now and then a barrier or a clean close_all on every rank, with labels. One rank (the middle
one) does the one thing that fails, about two thirds of the way in (a skipped close and a leak:
at the end). Every `expect` is the default "ok", so the scenario fails (exit 1) or hangs (exit 3)
under hmc-run; except the leak, which passes its expectations and leaves its resources held.
"""
import json
import sys

KINDS = ("skipped-close", "divergent-signature", "different-stages", "crash",
         "close-error-retry", "leak")


def noise(count, start):
    """About `count` steps of module churn; names noise<start>..."""
    steps = []
    i = start
    while len(steps) < count:
        name = f"noise{i}"
        steps += [
            {"op": "create", "module": name, "features": 16 + 16 * (i % 3), "label": f"cycle {i}"},
            {"op": "forward", "module": name, "batch": 4},
            {"op": "drop", "module": name},
        ]
        if i % 7 == 6:
            steps.append({"op": "barrier", "label": "sync"})
        if i % 25 == 24:
            steps.append({"op": "close_all", "label": "periodic cleanup"})
        i += 1
    return steps[:count]


def seeded(kind, world):
    odd = world // 2  # the rank that does something different
    others = [r for r in range(world) if r != odd]
    if kind == "skipped-close":
        return [{"op": "create", "module": "victim"},
                {"op": "forward", "module": "victim"},
                {"op": "close_all", "ranks": others, "label": f"rank {odd} skips this close"}]
    if kind == "divergent-signature":
        return [{"op": "create", "module": "victim"},
                {"op": "forward", "module": "victim", "ranks": others, "dtype": "float32"},
                {"op": "forward", "module": "victim", "ranks": [odd], "dtype": "float64"}]
    if kind == "different-stages":
        return [{"op": "create", "module": "victim"},
                {"op": "forward", "module": "victim"},
                {"op": "create", "module": "late"},
                {"op": "forward", "module": "late", "ranks": others},
                {"op": "close_all", "ranks": [odd]}]
    if kind == "crash":
        return [{"op": "fault", "kind": "crash", "ranks": [odd], "label": f"rank {odd} dies"}]
    if kind == "close-error-retry":
        return [{"op": "create", "module": "victim"},
                {"op": "forward", "module": "victim"},
                {"op": "fault", "kind": "close_error", "count": 1, "ranks": [odd]},
                {"op": "close_all", "label": "fails on one rank"},
                {"op": "close_all", "label": "retry"}]
    if kind == "leak":
        # The ranks bind two modules in opposite orders; the errors that follow are expected,
        # so every step passes, but the shutdown cannot close anything: manifests differ.
        error = "binding order or specifications differ"
        return [{"op": "create", "module": "victim", "features": 64},
                {"op": "create", "module": "late", "features": 32},
                {"op": "forward", "module": "victim", "ranks": others},
                {"op": "forward", "module": "late", "ranks": [odd]},
                {"op": "forward", "module": "late", "ranks": others, "expect_error": error},
                {"op": "forward", "module": "victim", "ranks": [odd], "expect_error": error},
                {"op": "close_all", "expect_error": "manifests differ"}]
    raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")


def scenario(kind, steps, world, timeout_s=3):
    # A skipped close shows as a hang when the rank that skipped it has nothing more to run
    # with the others (the end of a job); with steps after it, it is a collective mismatch.
    # A leak likewise shows only at the end (later binds would fail unexpectedly).
    share = steps if kind in ("skipped-close", "leak") else steps * 2 // 3
    before = noise(share, 0)
    after = noise(steps - len(before), 100000)
    return {
        "format": "hmc-scenario/1",
        "name": f"{kind}-in-noise",
        "description": f"A seeded {kind} among {steps} steps of module churn on {world} ranks.",
        "world_size": world,
        "device": "cpu",
        "timeout_s": timeout_s,
        "steps": before + seeded(kind, world) + after,
    }


def main():
    if len(sys.argv) != 5 or sys.argv[1] not in KINDS:
        print(__doc__)
        return 2
    kind, steps, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    with open(out, "w") as f:
        json.dump(scenario(kind, steps, world), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
