"""Compare hmc-run with the reference runner (shared/oracle/run_oracle.py) on scenario files.

Used by tests/e2e/test_differential.py (CTest) and scripts/compare-reference (users).
Standard library only. The conformance fields of hmc-report/1 are compared per rank and
step (docs/scenario-extensions.md, "reference_differs"):

- status; error kind; error message word for word for runtime_error, value_error,
  type_error and check_failed (timeouts and other kinds by kind only);
- bind: present on the same steps, same binding_id and reused;
- ranks[].final and the outcome, unless the scenario declares `reference_differs`;
- a rank that crashed in the reference (no steps there) must be "crashed" in hmc.

Steps listed in the scenario's `reference_differs.steps` are not compared with the
reference: there hmc must meet the scenario's own expectation (`expected: true`), and a
scenario with `reference_differs` must pass in hmc.
"""
import json
import os
import subprocess
import sys
import tempfile

EXACT_MESSAGE_KINDS = ("runtime_error", "value_error", "type_error", "check_failed")
# Benchmark scenarios repeat many cycles; the reference runner is slow, so the differential
# runs a copy whose repeat counts are at most this (the semantics per cycle are the same).
DEFAULT_MAX_REPEAT = 20


def find_oracle(repo_root):
    """The reference runner: ../shared/oracle/run_oracle.py next to the repository."""
    return os.path.normpath(os.path.join(repo_root, "..", "shared", "oracle", "run_oracle.py"))


def reference_unavailable(oracle, python="/usr/bin/python3"):
    """Why the reference runner cannot run here, or None."""
    if not os.path.isfile(oracle):
        return f"the reference runner {oracle} is missing"
    if not os.path.isfile(python):
        return f"{python} is missing"
    probe = subprocess.run([python, "-c", "import torch, torch.distributed as d; "
                            "assert d.is_available() and d.is_gloo_available()"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"{python} cannot import torch with gloo (python3-torch missing?): {last}"
    return None


def is_cpu_scenario(scenario):
    return scenario.get("device", "auto") in ("auto", "cpu")


def reduced_copy(scenario, max_repeat=DEFAULT_MAX_REPEAT):
    """The scenario with every repeat count and `repeat` field capped at max_repeat."""
    def cap(steps):
        out = []
        for step in steps:
            step = dict(step)
            if step.get("op") == "repeat":
                step["count"] = min(step.get("count", 1), max_repeat)
                step["steps"] = cap(step.get("steps", []))
            if "repeat" in step:
                step["repeat"] = min(step["repeat"], max_repeat)
            out.append(step)
        return out
    copy = dict(scenario)
    copy["steps"] = cap(scenario.get("steps", []))
    return copy


def differing_steps(scenario):
    extension = scenario.get("reference_differs")
    return set(extension.get("steps", [])) if isinstance(extension, dict) else set()


def compare_reports(scenario, hmc, ref):
    """Differences between hmc's and the reference's reports, as readable lines."""
    problems = []
    differs = differing_steps(scenario)
    declared = isinstance(scenario.get("reference_differs"), dict)
    if declared:
        if hmc.get("outcome") != "pass":
            problems.append(f"outcome: hmc {hmc.get('outcome')!r}, expected 'pass' "
                            "(reference_differs: hmc's own expectations must hold)")
    elif hmc.get("outcome") != ref.get("outcome"):
        problems.append(f"outcome: hmc {hmc.get('outcome')!r}, reference {ref.get('outcome')!r}")
    for key in ("format", "world_size"):
        if hmc.get(key) != ref.get(key):
            problems.append(f"{key}: hmc {hmc.get(key)!r}, reference {ref.get(key)!r}")
    hmc_ranks = {r["rank"]: r for r in hmc.get("ranks", [])}
    ref_ranks = {r["rank"]: r for r in ref.get("ranks", [])}
    if sorted(hmc_ranks) != sorted(ref_ranks):
        problems.append(f"ranks: hmc {sorted(hmc_ranks)}, reference {sorted(ref_ranks)}")
    for rank in sorted(set(hmc_ranks) & set(ref_ranks)):
        h, r = hmc_ranks[rank], ref_ranks[rank]
        where = f"rank {rank}"
        if bool(h.get("crashed")) != bool(r.get("crashed")):
            problems.append(f"{where}: crashed: hmc {bool(h.get('crashed'))}, "
                            f"reference {bool(r.get('crashed'))}")
        if r.get("crashed"):
            continue  # the reference keeps no steps of a crashed rank
        h_steps = {s["index"]: s for s in h.get("steps", [])}
        r_steps = {s["index"]: s for s in r.get("steps", [])}
        if sorted(h_steps) != sorted(r_steps):
            problems.append(f"{where}: step indices: hmc {sorted(h_steps)}, "
                            f"reference {sorted(r_steps)}")
        for index in sorted(set(h_steps) & set(r_steps)):
            problems += compare_step(f"{where} step {index}", h_steps[index], r_steps[index],
                                     index in differs)
        if not declared and h.get("final") != r.get("final"):
            problems.append(f"{where}: final: hmc {h.get('final')}, reference {r.get('final')}")
    return problems


def compare_step(where, h, r, differs):
    if h.get("op") != r.get("op"):
        return [f"{where}: op: hmc {h.get('op')!r}, reference {r.get('op')!r}"]
    where = f"{where} ({h.get('op')}{' ' + h['module'] if 'module' in h else ''})"
    if differs:
        if not h.get("expected", False):
            return [f"{where}: listed in reference_differs, but hmc did not meet the scenario's "
                    f"expectation: status {h.get('status')!r}, error {h.get('error')}"]
        return []
    problems = []
    if h.get("status") != r.get("status"):
        problems.append(f"{where}: status: hmc {h.get('status')!r} {describe_error(h)}, "
                        f"reference {r.get('status')!r} {describe_error(r)}")
        return problems
    he, re_ = h.get("error"), r.get("error")
    if (he is None) != (re_ is None):
        problems.append(f"{where}: error: hmc {he}, reference {re_}")
    elif he is not None:
        if he.get("kind") != re_.get("kind"):
            problems.append(f"{where}: error kind: hmc {he.get('kind')!r} ({he.get('message')!r}), "
                            f"reference {re_.get('kind')!r} ({re_.get('message')!r})")
        elif he.get("kind") in EXACT_MESSAGE_KINDS and he.get("message") != re_.get("message"):
            problems.append(f"{where}: error message ({he.get('kind')}):\n"
                            f"      hmc       {he.get('message')!r}\n"
                            f"      reference {re_.get('message')!r}")
    hb, rb = h.get("bind"), r.get("bind")
    if (hb is None) != (rb is None):
        problems.append(f"{where}: bind: hmc {hb}, reference {rb}")
    elif hb is not None:
        for key in ("binding_id", "reused"):
            if hb.get(key) != rb.get(key):
                problems.append(f"{where}: bind {key}: hmc {hb.get(key)!r}, "
                                f"reference {rb.get(key)!r}")
    if h.get("expected") != r.get("expected"):
        problems.append(f"{where}: expected: hmc {h.get('expected')}, "
                        f"reference {r.get('expected')}")
    return problems


def describe_error(step):
    error = step.get("error")
    return f"({error.get('kind')}: {error.get('message')!r})" if error else ""


def run_hmc(hmc_run, scenario_path, report_path, extra=()):
    """Runs hmc-run on CPU; returns (exit code, report or None, output)."""
    proc = subprocess.run([hmc_run, scenario_path, "--device", "cpu", "--quiet",
                           "--report", report_path, *extra],
                          capture_output=True, text=True, timeout=600)
    report = None
    if os.path.exists(report_path):
        with open(report_path) as fh:
            report = json.load(fh)
    return proc.returncode, report, proc.stdout + proc.stderr


def run_reference(oracle, scenario_path, report_path, python="/usr/bin/python3", timeout=300):
    """Runs the reference runner; returns (exit code, report or None, output)."""
    # The reference keeps its ranks' files in a mkdtemp folder it never removes: give it a
    # TMPDIR of its own, removed after it.
    with tempfile.TemporaryDirectory(prefix="hmc-reference-") as tmpdir:
        try:
            proc = subprocess.run([python, oracle, scenario_path, "--report", report_path],
                                  capture_output=True, text=True, timeout=timeout,
                                  env=dict(os.environ, TMPDIR=tmpdir))
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as error:
            code, output = -1, f"the reference runner took longer than {timeout} s: {error}"
    report = None
    if os.path.exists(report_path):
        with open(report_path) as fh:
            report = json.load(fh)
    return code, report, output


def compare_file(path, hmc_run, oracle, work_dir=None, max_repeat=DEFAULT_MAX_REPEAT,
                 python="/usr/bin/python3", hmc_args=()):
    """Runs one scenario through both runners; returns the list of problems (empty: agree)."""
    with open(path) as fh:
        scenario = json.load(fh)
    own_dir = work_dir is None
    work_dir = work_dir or tempfile.mkdtemp(prefix="hmc-compare-")
    base = os.path.splitext(os.path.basename(path))[0]
    reduced = reduced_copy(scenario, max_repeat)
    scenario_path = path
    if reduced != scenario:
        scenario_path = os.path.join(work_dir, base + ".reduced.json")
        with open(scenario_path, "w") as fh:
            json.dump(reduced, fh, indent=1)
    hmc_code, hmc_report, hmc_out = run_hmc(hmc_run, scenario_path,
                                            os.path.join(work_dir, base + ".hmc.json"), hmc_args)
    ref_code, ref_report, ref_out = run_reference(oracle, scenario_path,
                                                  os.path.join(work_dir, base + ".ref.json"),
                                                  python)
    problems = []
    if hmc_report is None:
        problems.append(f"hmc-run wrote no report (exit {hmc_code}): {hmc_out.strip()[-500:]}")
    if ref_report is None:
        problems.append(f"the reference wrote no report (exit {ref_code}): "
                        f"{ref_out.strip()[-500:]}")
    if hmc_report is not None and ref_report is not None:
        problems += compare_reports(reduced, hmc_report, ref_report)
    if own_dir and not problems:
        for name in os.listdir(work_dir):
            os.unlink(os.path.join(work_dir, name))
        os.rmdir(work_dir)
    return problems


def main(argv):
    import argparse
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", ".."))
    parser = argparse.ArgumentParser(
        description="Run scenario files through hmc-run and the reference runner "
                    "(../shared/oracle/run_oracle.py) and compare the conformance fields.")
    parser.add_argument("scenarios", nargs="+", help="scenario files")
    parser.add_argument("--hmc-run", default=os.path.join(repo, "build", "app", "hmc-run"))
    parser.add_argument("--oracle", default=find_oracle(repo))
    parser.add_argument("--max-repeat", type=int, default=DEFAULT_MAX_REPEAT,
                        help="cap repeat counts for both runners (default %(default)s)")
    parser.add_argument("--keep", metavar="DIR", help="keep both reports in DIR")
    parser.add_argument("--transport", help="hmc-run's --transport (default: hmc-run's own)")
    args = parser.parse_args(argv)
    reason = reference_unavailable(args.oracle)
    if reason:
        print(f"compare-reference: cannot run the reference: {reason}", file=sys.stderr)
        return 2
    if not os.access(args.hmc_run, os.X_OK):
        print(f"compare-reference: {args.hmc_run} is not an executable; build it "
              "(ninja -C build hmc-run) or pass --hmc-run", file=sys.stderr)
        return 2
    failed = 0
    for path in args.scenarios:
        if args.keep:
            os.makedirs(args.keep, exist_ok=True)
        extra = ("--transport", args.transport) if args.transport else ()
        problems = compare_file(path, args.hmc_run, args.oracle, args.keep, args.max_repeat,
                                hmc_args=extra)
        print(f"{'agree' if not problems else 'DIFFER'}  {path}")
        for line in problems:
            print(f"    {line}")
        failed += bool(problems)
    print(f"# {len(args.scenarios) - failed} agree, {failed} differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
