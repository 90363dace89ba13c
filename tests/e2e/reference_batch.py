#!/usr/bin/python3
"""Runs many scenarios through the reference runner (../shared/oracle/run_oracle.py) with one
import of it and of torch, instead of one python3 process per scenario (each loads torch:
about 1.5 s of CPU). Used by test_differential.py.

    reference_batch.py ORACLE JOBS.json [--jobs N] [--timeout S]

JOBS.json: [[scenario_path, report_path], ...]. Each scenario runs in a process of its own,
forked from this one after the import (the reference itself forks its ranks from its process
the same way), with argv as `run_oracle.py SCENARIO --report REPORT` and a TMPDIR of its own
(the reference leaves its ranks' folder there), removed after it; at most N at a time. Writes
JOBS.json.results: [{"scenario", "exit", "output"}, ...] in the jobs' order; a run past
--timeout seconds is killed (exit -1).
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time


def load(oracle):
    spec = importlib.util.spec_from_file_location("run_oracle", oracle)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(oracle))
    spec.loader.exec_module(module)  # imports torch, once
    return module


def start(module, oracle, scenario, report, work):
    """Forks a child running the reference on one scenario; its output goes to a file."""
    tmpdir = tempfile.mkdtemp(prefix="hmc-reference-", dir=work)
    output = os.path.join(tmpdir, "output.txt")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ["TMPDIR"] = tmpdir
            tempfile.tempdir = None  # the reference's mkdtemp reads TMPDIR again
            sys.argv = [oracle, scenario, "--report", report]
            module.main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except BaseException as error:  # noqa: BLE001 - reported as the run's output
            print(f"reference_batch: {error!r}", file=sys.stderr)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid, tmpdir, output


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("oracle")
    parser.add_argument("jobs_file")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    with open(args.jobs_file) as fh:
        jobs = json.load(fh)
    module = load(args.oracle)
    work = tempfile.mkdtemp(prefix="hmc-reference-batch-")
    results = [None] * len(jobs)
    running = {}  # pid -> (index, tmpdir, output, deadline)
    queue = list(enumerate(jobs))
    try:
        while queue or running:
            while queue and len(running) < max(1, args.jobs):
                index, (scenario, report) = queue.pop(0)
                pid, tmpdir, output = start(module, args.oracle, scenario, report, work)
                running[pid] = (index, tmpdir, output, time.monotonic() + args.timeout)
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                for child, (index, _, _, deadline) in running.items():
                    if time.monotonic() > deadline:
                        os.kill(child, signal.SIGKILL)
                time.sleep(0.02)
                continue
            if pid not in running:
                continue
            index, tmpdir, output, deadline = running.pop(pid)
            with open(output, errors="replace") as fh:
                text = fh.read()
            code = os.waitstatus_to_exitcode(status)
            if code < 0 and time.monotonic() > deadline:
                code, text = -1, text + f"\nthe reference runner took longer than {args.timeout} s"
            results[index] = {"scenario": jobs[index][0], "exit": code, "output": text}
            shutil.rmtree(tmpdir, ignore_errors=True)
    finally:
        for child in running:
            os.kill(child, signal.SIGKILL)
        shutil.rmtree(work, ignore_errors=True)
    with open(args.jobs_file + ".results", "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
