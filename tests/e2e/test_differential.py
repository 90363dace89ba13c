#!/usr/bin/python3
"""Differential test (CTest label e2e): every CPU scenario of scenarios/ through hmc-run and
through the reference runner (../shared/oracle/run_oracle.py), conformance fields compared
per rank and step (see reference_compare.py and docs/scenario-extensions.md).

usage: test_differential.py HMC_RUN [REPO_ROOT] [--oracle PATH] [--jobs N]

Exits 77 (CTest: skipped) with the reason when the reference runner or python3-torch is
missing. Benchmark scenarios run with repeat counts capped (reference_compare.DEFAULT_MAX_REPEAT).
hmc-run runs them all in one process (a report set), the reference in one batch
(reference_batch.py: one import of torch, a forked process per scenario). Prints one line per
scenario and a closing "N passed, N failed".
"""
import argparse
import glob
import json
import os
import subprocess
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
    # The reference spawns world_size processes per scenario; two scenarios at a time suit 2
    # cores.
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
    # Each scenario as both runners see it (benchmark repeats capped), one file per scenario.
    reduced, paths = {}, []
    for path in files:
        base = os.path.splitext(os.path.basename(path))[0]
        with open(path) as fh:
            reduced[path] = reference_compare.reduced_copy(json.load(fh))
        paths.append(os.path.join(work, base + ".json"))
        with open(paths[-1], "w") as fh:
            json.dump(reduced[path], fh, indent=1)
    # One hmc-run of them all and one batch of reference runs (each scenario still a process of
    # its own there), rather than a process per scenario and runner: each loads LibTorch.
    hmc_set = os.path.join(work, "hmc.json")
    hmc_proc = subprocess.run([args.hmc_run, *paths, "--device", "cpu", "--quiet",
                               "--report", hmc_set], capture_output=True, text=True,
                              timeout=900)
    hmc_reports = []
    if os.path.exists(hmc_set):
        with open(hmc_set) as fh:
            hmc_reports = json.load(fh).get("reports", [])
    jobs = [[path, path[:-5] + ".ref.json"] for path in paths]
    with open(os.path.join(work, "reference-jobs.json"), "w") as fh:
        json.dump(jobs, fh)
    batch = subprocess.run(["/usr/bin/python3", os.path.join(here, "reference_batch.py"), oracle,
                            os.path.join(work, "reference-jobs.json"), "--jobs",
                            str(max(1, args.jobs)), "--timeout", "300"],
                           capture_output=True, text=True, timeout=1800)
    results_path = os.path.join(work, "reference-jobs.json.results")
    results = []
    if os.path.exists(results_path):
        with open(results_path) as fh:
            results = json.load(fh)

    passed = failed = 0
    for index, path in enumerate(files):
        name = os.path.basename(path)
        problems = []
        hmc = hmc_reports[index] if len(hmc_reports) == len(files) else None
        if hmc is None:
            problems.append(f"hmc-run wrote no report of each scenario (exit "
                            f"{hmc_proc.returncode}, {len(hmc_reports)} reports): "
                            f"{(hmc_proc.stdout + hmc_proc.stderr).strip()[-500:]}")
        ref = None
        if os.path.exists(jobs[index][1]):
            with open(jobs[index][1]) as fh:
                ref = json.load(fh)
        else:
            result = results[index] if len(results) == len(files) else None
            why = (f"exit {result['exit']}: {result['output'].strip()[-500:]}" if result else
                   f"the batch ended with {batch.returncode}: "
                   f"{(batch.stdout + batch.stderr).strip()[-500:]}")
            problems.append(f"the reference wrote no report ({why})")
        if hmc is not None and ref is not None:
            problems += reference_compare.compare_reports(reduced[path], hmc, ref)
        if problems:
            failed += 1
            print(f"FAIL  {name}: hmc and the reference differ")
            for line in problems:
                print(f"    {line}")
        else:
            passed += 1
            print(f"ok    {name}", flush=True)
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
