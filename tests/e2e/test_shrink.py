#!/usr/bin/python3
"""End-to-end tests of `hmc-run shrink` (CTest label e2e). Standard library only.

usage: test_shrink.py HMC_RUN [REPO_ROOT]

Seeded failures buried in noise (shrink_seeds.py: a skipped close, a divergent signature on one
rank, ranks in different stages, a crash, a close error retried, a leak at shutdown; hundreds of
steps on 8 ranks)
shrink to their known minimal forms; the output validates and fails the same way (the
signature printed by --signature is the same before and after, and across runs); --as-test
gives a file that passes and fails once the failure is gone; a scenario that does not fail is
refused with exit 2; --max-seconds and SIGINT write the best so far (exit 0 and 130). Prints one line per check and a
closing "N passed, N failed, N skipped"; exits 1 on any failure.
"""
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shrink_seeds  # noqa: E402

HMC_RUN = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
REPO = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
WORK = tempfile.mkdtemp(prefix="hmc-shrink-")

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def output(proc):
    return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n"
            f"--- stderr\n{proc.stderr[-2000:]}")


def hmc(*args, timeout=120):
    return subprocess.run([HMC_RUN, *args], capture_output=True, text=True, timeout=timeout)


def write_seed(kind, steps=200, world=8):
    path = os.path.join(WORK, f"{kind}-{steps}x{world}.json")
    # A 1 s deadline: every run that hangs (the reference run, the confirmation, --signature)
    # costs it; trials use shrink's own 0.25 s.
    with open(path, "w") as f:
        json.dump(shrink_seeds.scenario(kind, steps, world, timeout_s=1), f)
    return path


def signature_of(path):
    proc = hmc("shrink", path, "--signature")
    check(proc.returncode == 0, f"--signature {path}\n{output(proc)}")
    lines = [l for l in proc.stdout.splitlines() if l.startswith("# signature: ")]
    check(len(lines) == 1, f"one '# signature:' line expected\n{output(proc)}")
    return json.loads(lines[0][len("# signature: "):])


def shrink(path, *extra):
    out = path.replace(".json", ".min.json")
    proc = hmc("shrink", path, "-o", out, *extra)
    check(proc.returncode == 0, f"shrink {path}\n{output(proc)}")
    last = proc.stdout.strip().splitlines()[-1]
    check(last.startswith("shrunk ") and "; same failure: " in last, f"final line\n{output(proc)}")
    valid = hmc("validate", out)
    check(valid.returncode == 0, f"the shrunk file does not validate\n{output(valid)}")
    with open(out) as f:
        return out, json.load(f), proc


def ops(doc):
    return [s["op"] for s in doc["steps"]]


def test(function):
    name = function.__name__
    start = time.monotonic()
    try:
        function()
    except Failure as failure:
        RESULTS["failed"] += 1
        print(f"FAIL  {name}: {failure}", flush=True)
        return
    except Exception:  # noqa: BLE001
        RESULTS["failed"] += 1
        print(f"FAIL  {name}: {traceback.format_exc()}", flush=True)
        return
    RESULTS["passed"] += 1
    print(f"ok    {name} ({time.monotonic() - start:.1f} s)", flush=True)


# ---- seeded failures -------------------------------------------------------------------------

def seeded(kind, expected_ops, expected_ranks, expected_kind):
    path = write_seed(kind)
    before = signature_of(path)
    check(before["kind"] == expected_kind, f"{kind}: signature {before}")
    out, doc, proc = shrink(path)
    check(ops(doc) == expected_ops and doc["world_size"] == expected_ranks,
          f"{kind}: expected {expected_ops} on {expected_ranks} ranks, got {ops(doc)} on "
          f"{doc['world_size']}\n{json.dumps(doc, indent=1)}\n{output(proc)}")
    after = signature_of(out)
    check(after == before, f"{kind}: signature changed: {before} -> {after}")
    return doc


def skipped_close_among_hundreds_of_steps():
    # A close validation runs whether or not there is a group to close: one close_all that one
    # of two ranks skips is the whole failure.
    doc = seeded("skipped-close", ["close_all"], 2, "hang")
    check(doc["steps"][0].get("ranks") in ([0], [1]),
          f"close_all should run on one of the two ranks: {doc['steps'][0]}")
    check(all("label" not in s for s in doc["steps"]), "labels are dropped")


def divergent_signature_on_one_rank():
    doc = seeded("divergent-signature", ["create", "forward", "forward"], 2, "manifest mismatch")
    check(sorted(s.get("dtype") for s in doc["steps"][1:]) == ["float32", "float64"],
          f"the two binds keep their dtypes: {doc['steps']}")
    check(doc["steps"][0]["features"] == 1 and doc["steps"][0]["module"] == "a",
          f"sizes and names shrink: {doc['steps'][0]}")


def ranks_in_different_stages():
    seeded("different-stages", ["create", "forward", "close_all"], 2, "collective mismatch")


def crash():
    # The crash, then the next collective of the live rank (a first forward binds: 'recycle').
    seeded("crash", ["fault", "create", "forward"], 2, "crash")


def close_error_retried():
    # One rank reproduces it: its own close fails ("close failed on ranks [N]"); the retry that
    # succeeds is not part of the failure.
    seeded("close-error-retry", ["create", "forward", "fault", "close_all"], 1, "error")


def leak_at_shutdown():
    # Every expectation met (hmc-run passes it), but the shutdown leaves resources held: the two
    # ranks bound different modules as #0. Four steps are the whole of it.
    doc = seeded("leak", ["create", "create", "forward", "forward"], 2, "leak")
    check(doc["steps"][0]["features"] != doc["steps"][1]["features"],
          f"the two modules must keep different sizes: {doc['steps']}")


def failure_inside_repeat_blocks():
    # The report names only top-level steps: the failure shows as the repeat op. Counts go to 1,
    # the noise inside the blocks goes, and the block that runs once is unwrapped.
    doc = {"format": "hmc-scenario/1", "name": "in-repeats", "world_size": 8, "device": "cpu",
           "timeout_s": 1, "steps": [
               {"op": "repeat", "count": 200, "label": "churn", "steps": [
                   {"op": "create", "module": "x"}, {"op": "forward", "module": "x"},
                   {"op": "drop", "module": "x"}]},
               {"op": "barrier", "repeat": 50},
               {"op": "repeat", "count": 30, "steps": [
                   {"op": "create", "module": "y"}, {"op": "forward", "module": "y"},
                   {"op": "barrier"},
                   {"op": "fault", "kind": "close_error", "count": 1, "ranks": [5]},
                   {"op": "close_all"}, {"op": "drop", "module": "y"}]}]}
    path = os.path.join(WORK, "in-repeats.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    out, small, proc = shrink(path)
    check(ops(small) == ["create", "forward", "fault", "close_all"] and small["world_size"] == 1,
          f"expected the block's four steps on one rank\n{json.dumps(small)}\n{output(proc)}")


# ---- the rest of the contract ----------------------------------------------------------------

def signature_is_stable_across_runs():
    path = write_seed("skipped-close", steps=200, world=8)
    first = signature_of(path)
    for _ in range(2):
        check(signature_of(path) == first, "the signature differs between runs")


def as_test_passes_while_the_bug_stays():
    path = write_seed("skipped-close", steps=120, world=4)
    out, doc, proc = shrink(path, "--as-test")
    run = hmc(out)
    check(run.returncode == 0, f"the --as-test file should pass\n{output(run)}\n{json.dumps(doc)}")
    # The bug fixed: every rank runs the close. The file must turn red.
    fixed = dict(doc)
    fixed["steps"] = [dict(s) for s in doc["steps"]]
    for step in fixed["steps"]:
        if step["op"] == "close_all":
            step.pop("ranks", None)
    fixed_path = os.path.join(WORK, "fixed.json")
    with open(fixed_path, "w") as f:
        json.dump(fixed, f)
    run = hmc(fixed_path)
    check(run.returncode != 0, f"with the bug gone the --as-test file should fail\n{output(run)}")


def passing_scenario_is_refused():
    out = os.path.join(WORK, "never.json")
    proc = hmc("shrink", os.path.join(REPO, "scenarios", "quickstart.json"), "-o", out)
    check(proc.returncode == 2, f"expected exit 2\n{output(proc)}")
    check("does not fail" in proc.stderr and "shrink needs a scenario that fails" in proc.stderr,
          output(proc))
    check(not os.path.exists(out), "nothing may be written")


def usage_errors():
    path = write_seed("skipped-close", steps=30, world=2)
    proc = hmc("shrink", path)
    check(proc.returncode == 2 and "-o OUT.json" in proc.stderr, output(proc))
    proc = hmc("shrink", path, "-o", path)
    check(proc.returncode == 2 and "is the input file" in proc.stderr, output(proc))
    bad = os.path.join(WORK, "bad.json")
    with open(bad, "w") as f:
        f.write('{"format": "hmc-scenario/1", "name": "x", "steps": [{"op": "nope"}]}')
    proc = hmc("shrink", bad, "-o", os.path.join(WORK, "bad.min.json"))
    check(proc.returncode == 2 and "/steps/0" in proc.stderr and "hmc-run validate" in proc.stderr,
          output(proc))


def max_seconds_writes_the_best_so_far():
    path = write_seed("skipped-close", steps=300, world=16)
    before = signature_of(path)
    out = os.path.join(WORK, "bounded.json")
    proc = hmc("shrink", path, "-o", out, "--max-seconds", "3")
    check(proc.returncode == 0, output(proc))
    check("# stopped at --max-seconds 3: wrote the best so far" in proc.stdout, output(proc))
    check(hmc("validate", out).returncode == 0, "the best so far does not validate")
    check(signature_of(out) == before, "the best so far fails differently")


def sigint_writes_the_best_so_far():
    path = write_seed("skipped-close", steps=1500, world=16)
    out = os.path.join(WORK, "interrupted.json")
    proc = subprocess.Popen([HMC_RUN, "shrink", path, "-o", out], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # Trials start after this line (printed and flushed before the first trial).
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("# shrinking "):
            break
    check(lines and lines[-1].startswith("# shrinking "), f"no '# shrinking' line: {lines}")
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    check(proc.returncode == 130, f"expected exit 130, got {proc.returncode}\n{stdout}\n{stderr}")
    check("wrote the best so far" in stderr, stderr)
    valid = hmc("validate", out)
    check(valid.returncode == 0, f"the best so far does not validate\n{output(valid)}")


def main():
    if HMC_RUN is None or not os.path.exists(HMC_RUN):
        print(__doc__)
        return 2
    for function in (passing_scenario_is_refused, usage_errors,
                     skipped_close_among_hundreds_of_steps, divergent_signature_on_one_rank,
                     ranks_in_different_stages, crash, close_error_retried, leak_at_shutdown,
                     failure_inside_repeat_blocks,
                     signature_is_stable_across_runs, as_test_passes_while_the_bug_stays,
                     max_seconds_writes_the_best_so_far, sigint_writes_the_best_so_far):
        test(function)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed, "
          f"{RESULTS['skipped']} skipped")
    if RESULTS["failed"] == 0:
        shutil.rmtree(WORK, ignore_errors=True)  # kept after a failure, to look at
    else:
        print(f"# scenarios and reports kept in {WORK}", flush=True)
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
