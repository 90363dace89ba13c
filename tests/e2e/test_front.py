#!/usr/bin/python3
"""End-to-end tests of hmc-run's two programs (CTest label e2e). Standard library only.

usage: test_front.py HMC_RUN HMC_RUN_TORCH REPO_ROOT

hmc-run (app/front.cpp) loads no LibTorch and runs --help, --version, validate, list and
compare itself; for a scenario run it execs hmc-run-torch (app/main.cpp) with argv unchanged.
Checks: the front loads no libtorch for --version and validate (the dynamic loader's own
list, LD_DEBUG=files); both programs print the same --help, validate and list output and exit
codes (one command line, app/cli.*); a run through the front records the front's argv in
its report; a front without its runner exits 2 naming the paths it tried.
Prints one line per check and "N passed, N failed"; exits 1 on any failure.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import traceback

HMC_RUN = os.path.abspath(sys.argv[1])
RUNNER = os.path.abspath(sys.argv[2])
REPO = os.path.abspath(sys.argv[3])
QUICKSTART = os.path.join(REPO, "scenarios", "quickstart.json")
TIMEOUT_S = 120  # a run loads LibTorch: seconds on a loaded machine, far below this

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def run(argv, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=REPO,
                          env=env)


@test
def the_front_loads_no_libtorch():
    env = dict(os.environ, LD_DEBUG="files")
    for args in (["--version"], ["validate", QUICKSTART], ["list", os.path.join(REPO, "scenarios")]):
        done = run([HMC_RUN] + args, env)
        assert done.returncode == 0, (args, done.returncode, done.stdout, done.stderr[-2000:])
        loaded = [line for line in done.stderr.splitlines() if "file=" in line]
        assert loaded, f"LD_DEBUG=files printed no loaded file for {args}: {done.stderr[-500:]}"
        torch = [line for line in loaded if "libtorch" in line or "libc10" in line]
        assert not torch, f"hmc-run {' '.join(args)} loaded LibTorch: {torch[:3]}"
    # The check can fail: the runner itself does load LibTorch.
    done = run([RUNNER, "--version"], env)
    assert any("libtorch" in line for line in done.stderr.splitlines()), \
        "LD_DEBUG=files shows no libtorch even for hmc-run-torch: the check above proves nothing"


@test
def both_programs_answer_the_same_command_line():
    cases = [["--help"], ["--version"], ["validate", QUICKSTART],
             ["validate", os.path.join(REPO, "no-such-file.json")],
             ["list", os.path.join(REPO, "scenarios")], [], ["--no-such-flag"],
             ["status", "--help"], ["compare", "--help"]]
    for args in cases:
        front, runner = run([HMC_RUN] + args), run([RUNNER] + args)
        assert (front.returncode, front.stdout, front.stderr) == \
            (runner.returncode, runner.stdout, runner.stderr), \
            f"hmc-run and hmc-run-torch differ on {args}:\n{front}\n{runner}"
    help_text = run([HMC_RUN, "--help"]).stdout
    for option in ("--world-size", "--transport", "--repetitions", "--report", "--trace",
                   "--master-port", "validate", "status", "list", "compare"):
        assert option in help_text, f"--help does not list {option}"


@test
def a_run_through_the_front_keeps_its_argv():
    with tempfile.TemporaryDirectory(prefix="hmc-front-") as work:
        report = os.path.join(work, "report.json")
        done = run([HMC_RUN, QUICKSTART, "--quiet", "--report", report])
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
        assert done.stdout.strip().endswith("# OK: 1 scenario passed"), done.stdout
        with open(report) as f:
            command = json.load(f)["environment"]["command"]
        assert command == [HMC_RUN, QUICKSTART, "--quiet", "--report", report], command


@test
def a_front_without_its_runner_names_what_it_tried():
    with tempfile.TemporaryDirectory(prefix="hmc-front-") as work:
        alone = os.path.join(work, "bin", "hmc-run")
        os.makedirs(os.path.dirname(alone))
        shutil.copy2(HMC_RUN, alone)
        done = run([alone, QUICKSTART])
        assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
        assert "cannot start the scenario runner hmc-run-torch" in done.stderr, done.stderr
        assert os.path.join(work, "bin", "hmc-run-torch") in done.stderr, done.stderr
        assert os.path.join(work, "libexec", "hmc-run-torch") in done.stderr, done.stderr
        # What needs no runner still works.
        assert run([alone, "validate", QUICKSTART]).returncode == 0


def main():
    passed = failed = 0
    for fn in TESTS:
        try:
            fn()
            passed += 1
            print(f"PASS {fn.__name__}", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {fn.__name__}", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
