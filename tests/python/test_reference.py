#!/usr/bin/python3
"""hmc for Python programs on the reference, unmodified (python/hmc, docs/python.md).

    test_reference.py HMC_RUN SOURCE_DIR [-k NAME]

A program on the reference itself (../shared/oracle/hyper_multicore, found through
REFERENCE_PATH or SOURCE_DIR/../shared/oracle) and on gloo, under Debian's torchrun
(tests/support/torchrun), wrapped with `-m hmc`:
- a skipped close: past HMC_TIMEOUT the lowest waiting rank prints the job's status, whose first
  failure names the rank that never came and the stage, once; `hmc-run status` attached from
  outside says the same while the ranks wait;
- HMC_ON_HANG=abort ends the waiting ranks with exit status 3;
- the hooks find every name they need in the reference (`-m hmc --check`), and a reference
  that lacks one fails naming it;
- a program that does not use the reference runs unchanged under the wrapper.
Exit 0, 1 (a case failed), 77 (skipped: no torch or no reference).
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
from cases import Skip, run_cases  # noqa: E402
from ports import reserved_port  # noqa: E402

HMC_RUN = os.path.abspath(sys.argv[1])
SOURCE = os.path.abspath(sys.argv[2])
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
PYTHON = "/usr/bin/python3"
TORCHRUN = os.path.join(SOURCE, "tests", "support", "torchrun")
PROGRAM = os.path.join(HERE, "reference_program.py")
REFERENCE = os.environ.get("REFERENCE_PATH") or os.path.normpath(
    os.path.join(SOURCE, "..", "shared", "oracle"))
WORK = tempfile.mkdtemp(prefix="hmc-python-")
DEADLINE_S = 2.0


def environment(**extra):
    env = dict(os.environ, PYTHONPATH=os.path.join(SOURCE, "python"), REFERENCE_PATH=REFERENCE,
               HMC_RUN=HMC_RUN, HMC_TIMEOUT=str(DEADLINE_S), OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def needs_reference():
    if not os.path.isfile(os.path.join(REFERENCE, "hyper_multicore", "modules", "module.py")):
        raise Skip(f"no reference at {REFERENCE} (set REFERENCE_PATH)")
    probe = subprocess.run([PYTHON, "-c", "import torch.distributed"], capture_output=True)
    if probe.returncode != 0:
        raise Skip("python3-torch is not installed (apt-get install python3-torch)")


def torchrun(world, args, port, env, timeout=120):
    command = [TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(world), "--master_addr",
               "127.0.0.1", "--master_port", str(port), "-m", "hmc", PROGRAM, *args]
    return subprocess.Popen(command, cwd=WORK, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=120):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun still ran after {timeout} s:\n{out}")
    return out


def skipped_close_is_named_at_the_deadline():
    needs_reference()
    port = reserved_port()
    began = time.monotonic()
    proc = torchrun(3, ["--skip-close", "1", "--linger", "10"], port, environment())
    # From outside, while the ranks wait: hmc-run status attaches to the job's own store.
    status = None
    while time.monotonic() - began < 60 and proc.poll() is None:
        time.sleep(0.5)
        probe = subprocess.run([HMC_RUN, "status", "--master-addr", "127.0.0.1",
                                "--master-port", str(port)], capture_output=True, text=True)
        if probe.returncode == 3:
            status = probe
            break
    out = finish(proc)
    assert status is not None, f"hmc-run status never said the job hung:\n{out}"
    first = ("# first failure: hang in 'close validation' #10: ranks [0, 2] waited there; "
             "rank 1 never arrived")
    assert first in status.stdout, status.stdout
    # Inside: the deadline's report, printed once (by rank 0, the lowest that waits), before
    # rank 1 ended (it lingers 10 s; the deadline is 2 s: room for a loaded machine).
    assert out.count(first) == 1, out
    assert out.index(first) < out.index("rank 1: finished"), out
    assert "# hmc: rank 0 waits in 'close validation' #10 for" in out, out
    assert "# hmc: rank 2 waits in 'close validation' #10 for" in out, out
    assert "rank 1 waits" not in out, out


def abort_at_the_deadline_ends_the_waiting_ranks():
    needs_reference()
    port = reserved_port()
    proc = torchrun(3, ["--skip-close", "2", "--linger", "90"], port,
                    environment(HMC_ON_HANG="abort"))
    began = time.monotonic()
    out = finish(proc)
    assert "HMC_ON_HANG=abort: ending this rank (exit status 3)" in out, out
    assert "exitcode  : 3" in out or "exit code 3" in out or "exitcode: 3" in out, out
    assert "rank 2 never arrived" in out, out
    # torchrun stopped the job once a rank ended with 3: long before rank 2's 90 s linger (a
    # bound on a wait, not a speed: a loaded machine takes 30 s here).
    assert time.monotonic() - began < 75, f"{time.monotonic() - began:.1f} s:\n{out}"


def hooks_find_every_name_they_need():
    needs_reference()
    done = subprocess.run([PYTHON, "-m", "hmc", "--check"], capture_output=True, text=True,
                          env=environment(PYTHONPATH=os.pathsep.join(
                              [os.path.join(SOURCE, "python"), REFERENCE])))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ("# hmc: hooked hyper_multicore._automatic, "
                                   "hyper_multicore.modules.module"), done.stdout


def a_reference_without_a_hooked_name_fails_naming_it():
    needs_reference()
    other = os.path.join(WORK, "other-reference")
    shutil.copytree(os.path.join(REFERENCE, "hyper_multicore"),
                    os.path.join(other, "hyper_multicore"))
    module = os.path.join(other, "hyper_multicore", "modules", "module.py")
    with open(module) as f:
        text = f.read()
    with open(module, "w") as f:
        f.write(text.replace("def _validate_collective_close(", "def _validate_close("))
    done = subprocess.run([PYTHON, "-m", "hmc", "--check"], capture_output=True, text=True,
                          env=environment(PYTHONPATH=os.pathsep.join(
                              [os.path.join(SOURCE, "python"), other])))
    assert done.returncode == 1, done.stdout + done.stderr
    assert ("lacks hyper_multicore.modules.module._MulticoreResourceManager."
            "_validate_collective_close") in done.stderr, done.stderr


def a_program_without_the_reference_runs_unchanged():
    needs_reference()
    port = reserved_port()
    proc = torchrun(2, ["--no-reference"], port, environment())
    out = finish(proc)
    assert proc.returncode == 0, out
    assert out.count("plain program gathered [0, 1]") == 2, out
    assert "# hmc:" not in out, out


CASES = [(f.__name__, f) for f in (
    skipped_close_is_named_at_the_deadline,
    abort_at_the_deadline_ends_the_waiting_ranks,
    hooks_find_every_name_they_need,
    a_reference_without_a_hooked_name_fails_naming_it,
    a_program_without_the_reference_runs_unchanged,
)]

if __name__ == "__main__":
    sys.exit(run_cases(CASES, only=ONLY, cleanup=lambda: shutil.rmtree(WORK, ignore_errors=True)))
