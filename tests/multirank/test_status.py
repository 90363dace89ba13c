#!/usr/bin/python3
"""`hmc-run status` against real multi-process jobs on 127.0.0.1 (CTest label multirank).

Usage: test_status.py HMC_RUN SOURCE_DIR [--status-without-torch 0|1] [-k NAME]

A self-launched tcp job honours --master-port and prints its store's address; `hmc-run status`
attached to a hung 4-rank job names the rank that waits, where, and the ranks that never
arrived, exit 0 while no rank is past its deadline, 3 once one waited past it, 2 when nothing
listens or the usage is bad, and (--status-without-torch 1: a build whose hmc speaks its
LibTorch's store protocol) the attach loads no LibTorch; `kill -USR1` on a rank dumps its flight record to stderr. Every
wait is bounded; the job is killed with its whole process group at the end of each test.
Python 3 standard library only. Prints "N passed, N failed" last.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from cases import run_cases  # noqa: E402
from ports import reserved_port  # noqa: E402

HMC_RUN = sys.argv[1] if len(sys.argv) > 1 else "build/app/hmc-run"
SOURCE_DIR = sys.argv[2] if len(sys.argv) > 2 else "."
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
WITHOUT_TORCH = ("--status-without-torch" in sys.argv and
                 sys.argv[sys.argv.index("--status-without-torch") + 1] == "1")
TMP = tempfile.mkdtemp(prefix="hmc-status-")

LAUNCH_VARS = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|"
                         r"GROUP_RANK|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PMI_.*|PMIX_.*|HMC_.*)$")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not LAUNCH_VARS.match(k)}
    env.update(extra or {})
    return env


def scenario(name, steps, world_size=4, timeout_s=30):
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump({"format": "hmc-scenario/1", "name": name, "world_size": world_size,
                   "device": "cpu", "timeout_s": timeout_s, "steps": steps}, f)
    return path


class Job:
    """An hmc-run process launch in the background, stderr to a file (the rank processes
    share it), killed with its process group and its ranks on exit."""

    def __init__(self, args):
        self.port = reserved_port()
        self.stderr_path = os.path.join(TMP, f"stderr-{time.monotonic_ns()}")
        self.pid_file = os.path.join(TMP, f"pids-{time.monotonic_ns()}")
        self.stderr = open(self.stderr_path, "w")
        # The job is SIGKILLed at the end, so hmc-run cannot remove its run folder: keep it
        # in this test's folder, which main() removes.
        env = clean_env({"HMC_LAUNCH_PID_FILE": self.pid_file, "TMPDIR": TMP})
        self.proc = subprocess.Popen(
            [HMC_RUN] + args + ["--transport", "tcp", "--master-port", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=self.stderr, start_new_session=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait(timeout=30)
        self.stderr.close()

    def pids(self):
        try:
            with open(self.pid_file) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def err(self):
        with open(self.stderr_path) as f:
            return f.read()


def status(port, *extra, bound=30, env=None):
    """Runs `hmc-run status` once; returns (exit code, stdout, stderr, wall seconds)."""
    began = time.monotonic()
    proc = subprocess.run([HMC_RUN, "status", "--master-port", str(port), *extra],
                          env=clean_env(env), capture_output=True, text=True, timeout=bound)
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began


def poll_status(port, until, bound=60):
    """Runs `status --json` until `until(code, document)` holds; returns the last result."""
    end = time.monotonic() + bound
    last = None
    while time.monotonic() < end:
        code, out, err, wall = status(port, "--json", "--timeout", "5")
        document = json.loads(out) if out.strip() else None
        last = (code, document, err, wall)
        if until(code, document):
            return last
        time.sleep(0.2)
    raise AssertionError(f"status never showed what was awaited within {bound} s; last: {last}")


def all_beating(world):
    return lambda code, doc: (doc is not None and
                              all(r["state"] != "unknown" for r in doc["ranks"]) and
                              len(doc["ranks"]) == world)


def skipped_close_settled(code, doc):
    """skipped-close-hang.json at 4 ranks in the state the tests look at: rank 0 waits in
    the close validation of step 2 and ranks 1-3 are done. "rank 0 waiting" alone is not
    enough: rank 0 also waits, for a moment, in the recycle of step 1 until the others have
    arrived there (status read it so 0.06 s into a run), and ranks 1-3 are still running their
    check step when rank 0 has just entered the validation. Both states below are final until
    rank 0's deadline (HUNG_JOB_TIMEOUT), so what the tests assert afterwards cannot change
    under them."""
    if not all_beating(4)(code, doc):
        return False
    rank0 = doc["ranks"][0]
    return (rank0["state"] == "waiting" and rank0.get("stage") == "close validation" and
            rank0.get("step") == 2 and
            all(doc["ranks"][r]["state"] == "done" for r in (1, 2, 3)))


def flight_dump(job, rank, bound=30):
    """The whole flight record rank `rank` dumped to the job's stderr: its header line names
    how many entries follow; waits (bounded) until all of them are there."""
    header = re.compile(rf"^# hmc flight record of rank {rank} \(.*; (\d+) entries, .*$", re.M)
    end = time.monotonic() + bound
    while True:
        text = job.err()
        found = header.search(text)
        if found:
            # the column header, then one "#  <seq> ..." row per entry (other ranks' lines may
            # follow in the same file)
            rows = [line for line in text[found.end():].splitlines()
                    if re.match(r"^#\s+(seq|\d+)\s", line)]
            if len(rows) >= 1 + int(found.group(1)):
                return text
        assert time.monotonic() < end, f"no complete flight record of rank {rank} within " \
                                       f"{bound} s:\n{text}"
        time.sleep(0.05)


def test_nothing_listening_exits_2_naming_address_and_port():
    port = reserved_port()
    code, out, err, _ = status(port, "--timeout", "2")
    assert code == 2, (code, out, err)
    assert f"127.0.0.1:{port}" in err and "Connection refused" in err, err


def test_bad_usage_exits_2():
    code, _, err, _ = status(0)
    assert code == 2 and "--master-port" in err, (code, err)
    proc = subprocess.run([HMC_RUN, "status"], env=clean_env(), capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "--master-port is required" in proc.stderr, proc.stderr


# The deadline of the hung-job tests. They look at a job within its deadline (exit 0,
# "progressing") and kill it when done; no rank is meant to time out. With 30 s, the looking
# (a status attach loads LibTorch: seconds each on a loaded machine) had to fit in rank 0's 30 s.
HUNG_JOB_TIMEOUT = "600"


def test_hung_job_names_the_missing_ranks_and_the_stage():
    hang = os.path.join(SOURCE_DIR, "scenarios", "skipped-close-hang.json")
    with Job([hang, "--world-size", "4", "--timeout", HUNG_JOB_TIMEOUT]) as job:
        code, doc, err, wall = poll_status(job.port, skipped_close_settled)
        assert f"# hmc-run: store at 127.0.0.1:{job.port} (attach: hmc-run status " \
               f"--master-port {job.port})" in job.err(), job.err()
        assert code == 0, (code, doc, err)  # waiting, but within its deadline
        assert doc["format"] == "hmc-status/1" and doc["verdict"] == "progressing", doc
        assert doc["job"]["scenario"] == "skipped-close-hang" and doc["job"]["world_size"] == 4
        rank0 = doc["ranks"][0]
        assert (rank0["stage"], rank0["step"]) == ("close validation", 2), rank0
        assert rank0["last_completed"]["stage"] == "recycle", rank0
        for rank in (1, 2, 3):
            assert doc["ranks"][rank]["state"] == "done", doc["ranks"][rank]
        diagnosis = doc["diagnosis"]
        assert diagnosis.startswith("rank 0 waits in 'close validation' #1 (step 2); "), diagnosis
        for rank in (1, 2, 3):
            assert f"rank {rank} never arrived: last completed 'recycle' #0 (step 1), " \
                   f"finished its steps" in diagnosis, diagnosis
        # The same in the table, once more: how long one attach takes (reported, not asserted),
        # and which shared libraries it loaded (the dynamic loader's own list).
        code, out, err, wall = status(job.port, env={"LD_DEBUG": "files"})
        assert code == 0, (code, out, err[-2000:])
        loaded = [line for line in err.splitlines() if "file=" in line]
        assert loaded, f"LD_DEBUG=files printed no loaded file: {err[-500:]}"
        torch = [line for line in loaded if "libtorch" in line or "libc10" in line]
        if WITHOUT_TORCH:
            assert not torch, f"hmc-run status loaded LibTorch: {torch[:3]}"
        else:  # LibTorch 2.x: c10d's client, in the runner
            assert torch, "hmc-run status loaded no LibTorch, but this build has no wire client"
        assert re.search(r"^\s+0\s+waiting\s+2\s+close validation\s+1\s", out, re.M), out
        assert "# waits: rank 0 waits in 'close validation' #1 (step 2); rank 1 never arrived" \
            in out, out
        attach = re.search(r"# attached and read 4 heartbeats in ([0-9.]+) s", out)
        assert attach, out
        print(f"# status on a hung 4-rank tcp job: {wall:.2f} s wall (process start included), "
              f"{float(attach.group(1)):.3f} s to attach and read, LibTorch "
              f"{'loaded' if torch else 'not loaded'}")


def test_sigusr1_dumps_a_rank_flight_record_to_stderr():
    hang = os.path.join(SOURCE_DIR, "scenarios", "skipped-close-hang.json")
    with Job([hang, "--world-size", "4", "--timeout", HUNG_JOB_TIMEOUT]) as job:
        poll_status(job.port, skipped_close_settled)
        pids = job.pids()
        assert len(pids) == 4, pids
        os.kill(pids[0], signal.SIGUSR1)
        text = flight_dump(job, 0)
        assert f"# hmc flight record of rank 0 (pid {pids[0]}, SIGUSR1): waiting in " \
               f"'close validation' #1 (step 2)" in text, text
        assert re.search(r"#\s+1 close validation\s+2 .* in_flight", text), text
        # The rank lives on and still waits.
        code, doc, _, _ = poll_status(job.port, lambda c, d: d is not None)
        assert doc["ranks"][0]["state"] == "waiting", doc


def test_a_rank_past_its_deadline_exits_3():
    # Rank 1 waits alone in the close validation until its 3 s deadline; the others sleep,
    # so rank 0 keeps the store up while status looks.
    path = scenario("rank-1-past-deadline", [
        {"op": "create", "module": "a"},
        {"op": "forward", "module": "a"},
        {"op": "close_all", "ranks": [1], "expect": "hang"},
        {"op": "sleep", "ranks": [0, 2, 3], "seconds": 60},
    ], timeout_s=3)
    with Job([path]) as job:
        # Exit 3 comes as soon as rank 1 waits past its deadline; its timeout is recorded a
        # moment later ("waits ... past its deadline" first, then "waited ... until"): poll
        # for the recorded one.
        code, doc, err, _ = poll_status(
            job.port, lambda c, d: c == 3 and d is not None and
            str(d["ranks"][1].get("problem", "")).startswith("rank 1 waited"))
        assert doc["verdict"] == "hung" and doc["exit_code"] == 3, doc
        problem = doc["ranks"][1]["problem"]
        assert problem == "rank 1 waited in 'close validation' #1 until its 3 s deadline " \
                          "(timeout)", problem
        assert doc["diagnosis"].startswith("rank 0 never arrived: last completed 'recycle' #0 "
                                           "(step 1), runs step 3; rank 1 waits in "
                                           "'close validation' #1 (step 2)"), doc["diagnosis"]
        # The same first failure as every other verdict: rank 1's wait, naming the ranks that
        # never came (not rank 1, which waited).
        assert doc["first_failure"] == "hang in 'close validation' #1: rank 1 waited there; " \
                                       "ranks [0, 2, 3] never arrived (rank 0: it runs step 3; " \
                                       "rank 2: it runs step 3; rank 3: it runs step 3)", doc
        code, out, _, _ = status(job.port)
        assert code == 3 and "# HUNG: some rank does not progress (exit 3)" in out, out
        assert "# first failure: hang in 'close validation' #1: rank 1 waited there; ranks " \
               "[0, 2, 3] never arrived" in out, out
        assert out.index("# first failure:") < out.index("# rank"), out


def main():
    tests = [(name, fn) for name, fn in sorted(globals().items())
             if name.startswith("test_") and callable(fn)]
    return run_cases(tests, only=ONLY, cleanup=lambda: shutil.rmtree(TMP, ignore_errors=True))


if __name__ == "__main__":
    sys.exit(main())
