#!/usr/bin/python3
"""Differential test (CTest label e2e): every CPU scenario of scenarios/ through hmc-run and
through the reference runner (../shared/oracle/run_oracle.py), conformance fields compared
per rank and step (see reference_compare.py and docs/scenario-extensions.md).

usage: test_differential.py HMC_RUN [REPO_ROOT] [--oracle PATH] [--jobs N]

Exits 77 (CTest: skipped) with the reason when the reference runner or python3-torch is
missing. Benchmark scenarios run with repeat counts capped (reference_compare.DEFAULT_MAX_REPEAT).
Prints one line per scenario and a closing "N passed, N failed".
"""
import argparse
import concurrent.futures
import glob
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_compare  # noqa: E402

SKIP = 77


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("hmc_run")
    parser.add_argument("repo", nargs="?", default=os.path.normpath(os.path.join(here, "..", "..")))
    parser.add_argument("--oracle")
    # The reference spawns world_size processes per scenario; two at a time suit 2 cores.
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    oracle = args.oracle or reference_compare.find_oracle(args.repo)
    reason = reference_compare.reference_unavailable(oracle)
    if reason:
        print(f"SKIP: differential test against the reference runner: {reason}")
        print("0 passed, 0 failed")
        return SKIP
    files = []
    for path in sorted(glob.glob(os.path.join(args.repo, "scenarios", "*.json"))):
        with open(path) as fh:
            scenario = json.load(fh)
        if reference_compare.is_cpu_scenario(scenario):
            files.append(path)
        else:
            print(f"skip  {os.path.basename(path)}: device {scenario.get('device')!r}")
    if not files:
        print("FAIL: no CPU scenarios found")
        print("0 passed, 1 failed")
        return 1
    work = tempfile.mkdtemp(prefix="hmc-differential-")
    start = time.monotonic()

    def compare(path):
        began = time.monotonic()
        try:
            problems = reference_compare.compare_file(path, args.hmc_run, oracle, work)
        except Exception as error:  # noqa: BLE001
            problems = [f"internal error: {error!r}"]
        return path, problems, time.monotonic() - began

    passed = failed = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for path, problems, seconds in pool.map(compare, files):
            name = os.path.basename(path)
            if problems:
                failed += 1
                print(f"FAIL  {name} ({seconds:.1f} s): hmc and the reference differ")
                for line in problems:
                    print(f"    {line}")
            else:
                passed += 1
                print(f"ok    {name} ({seconds:.1f} s)", flush=True)
    if failed:
        print(f"# both reports of each scenario are kept in {work}")
    else:
        for name in os.listdir(work):
            os.unlink(os.path.join(work, name))
        os.rmdir(work)
    print(f"# {time.monotonic() - start:.1f} s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
