#!/usr/bin/python3
"""The embedding example (examples/train_loop.cpp) under real launchers: a user's LibTorch
program that joins its world with hmc::joinWorld (hmc/world/world.hpp).

    test_embedding.py EXAMPLE HMC_RUN SOURCE_DIR

Cases (torchrun and mpirun, as users start them, on 127.0.0.1):
  - a clean run at 2 ranks (torchrun, mpirun) and at 4 (mpirun; torchrun's agent costs 2.4 s
    of CPU to start): every rank ends cleanly, rank 0's report says so, exit 0, and no
    `[info]` line is printed (the library logs at warn, as hmc-run does by default);
  - HMC_LOG_LEVEL=info: every rank's transport set-up lines are back, on stderr;
  - one rank skips its module's close (--skip-close): rank 0 waits in 'close validation' until
    the deadline; its report comes within the deadline + 2 s of its close, names the rank that
    never came, the stage and the host; `hmc-run status`, attached while rank 0 waits, names
    the waiting rank; the JSON report (HMC_REPORT) says the same and `hmc-run render` draws it;
    the launcher's exit is not 0;
  - the skipping rank reaches the world's end while the others wait for it: it waits there, and
    the first failure names it as never arriving, at the world's end with its group open;
  - one rank closes its two models in the other order and the program catches the error: the
    world ends FAILED (exit 1), led by the manifest mismatch naming that rank;
  - torchrun stopped with SIGTERM: rank 0 reports what every rank was doing before the signal;
  - a rank that dies in the middle of its steps: rank 0's report names it with its host;
  - mpirun's own teardown after a rank is killed (-9) while rank 0 works alone: Open MPI sends
    SIGCONT, SIGTERM a second later and SIGKILL 50 ms after that; rank 0's report, made at the
    SIGCONT, names the killed rank (its connection closed) and where every other rank waited,
    each with its host, within 3 s of the kill.

Exit 0 when every case passed, 1 when one failed, 77 (CTest skip) when none failed but a
launcher is missing (each skipped case says why).
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from cases import Skip, run_cases  # noqa: E402
from ports import reserved_port  # noqa: E402
from torch_probe import torchrun_missing  # noqa: E402

EXAMPLE, HMC_RUN, SOURCE = sys.argv[1], sys.argv[2], sys.argv[3]
TORCHRUN = os.path.join(SOURCE, "tests", "support", "torchrun")
PYTHON = "/usr/bin/python3"
HOST = socket.gethostname()
DEADLINE_S = 4.0  # HMC_TIMEOUT of the skipped-close cases
LINGER_S = 9.0    # how long the skipping rank works alone: past rank 0's report


def torchrun(world, args):
    missing = torchrun_missing(PYTHON)
    if missing:
        raise Skip(missing)
    return [PYTHON, TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(world),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{reserved_port()}",
            "--rdzv_id", f"hmc-embed-{os.getpid()}-{time.monotonic_ns()}",
            "--monitor_interval", "0.5", "--no_python", EXAMPLE] + args


def mpirun(world, args):
    found = shutil.which("mpirun")
    if found is None:
        raise Skip("mpirun: openmpi-bin is not installed (scripts/setup installs it)")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [found] + root + ["--oversubscribe", "-np", str(world), EXAMPLE] + args


LAUNCHERS = {"torchrun": torchrun, "mpirun": mpirun}


class Run:
    """A launcher's run with its output read line by line as it comes (stderr and stdout
    merged), each line with the moment it arrived."""

    def __init__(self, command, env, bound):
        self.command = command
        self.lines = []  # (seconds since start, text)
        self.began = time.monotonic()
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.bound = bound

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic() - self.began, line.rstrip("\n")))

    def wait_for(self, pattern, within):
        end = time.monotonic() + within
        while time.monotonic() < end:
            for at, text in list(self.lines):
                match = re.search(pattern, text)
                if match:
                    return at, match
            if self.process.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern!r} within {within} s:\n{self}")

    def finish(self):
        try:
            self.process.wait(timeout=self.bound)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
            raise AssertionError(f"the run outlived its {self.bound} s bound:\n{self}")
        self.reader.join(timeout=5)
        return self.process.returncode

    def text(self):
        return "\n".join(text for _, text in self.lines)

    def __str__(self):
        return f"$ {' '.join(self.command)}\n{self.text()}"


def environment(extra):
    env = dict(os.environ)
    env.update(extra)
    return env


def check_clean(launcher, world):
    run = Run(LAUNCHERS[launcher](world, ["--steps", "10"]), environment({"HMC_NAME": "clean"}),
              bound=120)
    code = run.finish()
    text = run.text()
    assert code == 0, f"exit {code}:\n{run}"
    assert f"# hmc: world 'clean' of {world} ranks joined ({launcher}, transport tcp)" in text, run
    for rank in range(world):
        assert re.search(rf"^  rank {rank} \({re.escape(HOST)}:\d+\): ended cleanly$", text,
                         re.M), run
    assert f"# OK: every rank of {world} ended cleanly (exit 0)" in text, run
    # The library logs at warn, as hmc-run does by default: no rank's transport set-up lines.
    assert not re.search(r"\[info\]", text), run


def check_log_level():
    """HMC_LOG_LEVEL=info brings back every rank's transport set-up lines, on stderr through
    the `hmc` logger; the run still ends cleanly."""
    command = torchrun(2, ["--steps", "2"])
    done = subprocess.run(command, env=environment({"HMC_NAME": "logged", "HMC_LOG_LEVEL": "info"}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout}{done.stderr}"
    for rank in (0, 1):
        assert re.search(rf"\[hmc\] \[info\] rank {rank} of the tcp transport listens on ",
                         done.stderr, re.M), done.stderr
    assert "[info]" not in done.stdout, done.stdout
    assert "# OK: every rank of 2 ended cleanly (exit 0)" in done.stdout + done.stderr, done


def check_skipped_close(launcher, world, attach_status):
    skipper = world - 1
    with tempfile.TemporaryDirectory(prefix="hmc-embed-") as folder:
        report = os.path.join(folder, "end.json")
        env = environment({"HMC_TIMEOUT": str(DEADLINE_S), "HMC_NAME": "skipped",
                           "HMC_REPORT": report})
        run = Run(LAUNCHERS[launcher](world, ["--steps", "4", "--skip-close", str(skipper),
                                              "--linger", str(LINGER_S)]), env, bound=120)
        _, joined = run.wait_for(r"--master-addr (\S+) --master-port (\d+)\)", 90)
        closing_at, _ = run.wait_for(r"# example: rank 0 closing its model", 90)
        status = None
        if attach_status:
            # Attach while rank 0 waits (its deadline is DEADLINE_S after its close).
            while time.monotonic() - run.began < closing_at + 1.0:
                time.sleep(0.05)
            status = subprocess.run([HMC_RUN, "status", "--master-addr", joined.group(1),
                                     "--master-port", joined.group(2)],
                                    capture_output=True, text=True, timeout=30)
        verdict_at, _ = run.wait_for(r"^# HUNG: ", 60)
        code = run.finish()
        text = run.text()
        assert code != 0, f"the launcher exited 0 after a hang:\n{run}"
        # Within the deadline + 2 s of rank 0's close.
        assert verdict_at - closing_at <= DEADLINE_S + 2.0, (
            f"rank 0's report came {verdict_at - closing_at:.2f} s after its close "
            f"(deadline {DEADLINE_S} s + 2 s):\n{run}")
        assert re.search(rf"^  rank 0 \({re.escape(HOST)}:\d+\): hang in 'close validation' #\d+",
                         text, re.M), run
        assert re.search(rf"^  rank {skipper} \({re.escape(HOST)}:\d+\): no end within 1 s; its "
                         r"heartbeat: running outside any collective", text, re.M), run
        assert re.search(rf"^# waits: .*rank {skipper} never arrived", text, re.M), run
        # The report leads with the first failure: rank 0's wait, and the rank that never came
        # (not rank 0, which waited, nor a later consequence).
        first = re.search(r"^# first failure: (.*)$", text, re.M)
        assert first and first.start() < text.index("  rank 0 ("), run
        assert re.match(rf"hang in 'close validation' #\d+: ranks? \[?0\b.* waited there; "
                        rf"rank {skipper} never arrived", first.group(1)), first.group(1)
        with open(report) as f:
            document = json.load(f)
        assert document["first_failure"]["kind"] == "hang", document["first_failure"]
        assert document["first_failure"]["ranks"] == [skipper], document["first_failure"]
        assert document["first_failure"]["stage"] == "close validation", document["first_failure"]
        assert document["format"] == "hmc-world-end/1", document
        assert document["outcome"] == "hang" and document["exit_code"] in (3, 143), document
        assert document["ranks"][skipper]["status"] == "missing", document
        assert HOST in document["ranks"][skipper]["where"], document
        # hmc-run render draws it: the verdict, the missing rank with its host, the stage.
        page = os.path.join(folder, "end.html")
        drawn = subprocess.run([HMC_RUN, "render", report, "--html", page], capture_output=True,
                               text=True, timeout=60)
        assert drawn.returncode == 0, drawn.stderr
        with open(page) as f:
            html = f.read()
        assert "Some rank did not reach the end" in html, html[:2000]
        # The first failure first, naming the skipping rank; its row says so.
        assert 0 < html.index("First failure: hang</strong>") < html.index('id="ranks"'), html
        assert re.search(rf"<tr class=\"part-cause\"><td class=\"num\">{skipper}</td><td><span "
                         r"class=\"tag part-cause\">the first failure</span></td>"
                         rf"<td>{re.escape(HOST)}:\d+</td><td><strong>missing</strong></td>",
                         html), html
        assert "<td>&#39;close validation&#39; #" in html, html
        assert "not checked: the world hung" in html and "not checked: not checked" not in html, \
            html
        if status is not None:
            lines = status.stdout
            assert status.returncode in (0, 3), f"status exit {status.returncode}:\n{lines}" \
                                                f"{status.stderr}"
            # Rank 0 waits (or, when hmc-run status itself started slowly on a loaded machine,
            # has just timed out) in 'close validation'; the skipping rank runs on elsewhere.
            assert re.search(r"^\s+0\s+(waiting\s+0|done\s+-)\s+close validation", lines,
                             re.M), lines
            assert re.search(rf"^\s+{skipper}\s+running\s+0\s", lines, re.M), lines
            assert re.search(rf"^# waits: rank 0 waits in 'close validation' #\d+ .*rank "
                             rf"{skipper} never arrived", lines, re.M), lines


def check_skipper_at_the_end(launcher, world):
    """The rank that skips its close reaches the world's end while the others wait for it in
    'close validation': it waits there (it does not enter their collective with a close of its
    own); the first failure is their wait, naming it as the rank that never arrived because it
    was at the world's end with its group open; HUNG (exit 3)."""
    skipper = world - 1
    with tempfile.TemporaryDirectory(prefix="hmc-embed-") as folder:
        report = os.path.join(folder, "end.json")
        env = environment({"HMC_TIMEOUT": str(DEADLINE_S), "HMC_NAME": "at-the-end",
                           "HMC_REPORT": report})
        run = Run(LAUNCHERS[launcher](world, ["--steps", "3", "--skip-close", str(skipper),
                                              "--linger", "0.5"]), env, bound=120)
        code = run.finish()
        text = run.text()
        assert code != 0, f"the launcher exited 0 after a hang:\n{run}"
        first = re.search(r"^# first failure: (.*)$", text, re.M)
        assert first, run
        assert re.match(rf"hang in 'close validation' #\d+: .* waited there; rank {skipper} "
                        rf"never arrived \(rank {skipper}: it had reached the world's end after "
                        rf"\d+ collectives, with 1 group\(s\) open \(\{{.*\"features\":64",
                        first.group(1)), first.group(1)
        assert re.search(rf"^# HUNG: hang in 'close validation' #\d+, rank {skipper} \(exit 3\)$",
                         text, re.M), run
        assert re.search(rf"^  rank {skipper} \({re.escape(HOST)}:\d+\): reached the world's end "
                         r"after \d+ collectives, with 1 group\(s\) open.*\[the first failure\]$",
                         text, re.M), run
        # Its own close never ran with the others': no manifest mismatch, no collective mismatch.
        assert "manifests differ" not in text and "different collectives" not in text, run
        document = json.load(open(report))
        assert document["outcome"] == "hang" and document["exit_code"] == 3, document
        assert document["first_failure"]["ranks"] == [skipper], document["first_failure"]
        assert document["ranks"][skipper]["at_end"]["open_groups"], document["ranks"][skipper]


def check_reordered_close(launcher, world):
    """One rank closes its two models in the other order: every rank's close raises "multicore
    resource manifests differ across ranks" and the program catches it. The world's end says
    FAILED (exit 1), leads with the manifest mismatch and names the rank whose manifest differs
    and what each holds; every rank's line says it saw that failure."""
    odd = world - 1
    with tempfile.TemporaryDirectory(prefix="hmc-embed-") as folder:
        report = os.path.join(folder, "end.json")
        env = environment({"HMC_TIMEOUT": str(DEADLINE_S), "HMC_NAME": "reordered",
                           "HMC_REPORT": report})
        run = Run(LAUNCHERS[launcher](world, ["--steps", "3", "--reorder-close", str(odd)]), env,
                  bound=120)
        code = run.finish()
        text = run.text()
        assert code == 1, f"exit {code} (want 1: a caught error fails the world):\n{run}"
        assert "multicore resource manifests differ across ranks" in text, run
        first = re.search(r"^# first failure: (.*)$", text, re.M)
        assert first and first.start() < text.index("  rank 0 ("), run
        assert re.match(rf"manifest mismatch in 'close validation' #\d+: rank {odd} differs from "
                        rf"rank 0 at manifest entry 0: rank 0 has \[(\d+),.*rank {odd} has "
                        rf"\[(\d+),", first.group(1)), first.group(1)
        assert re.search(rf"^# FAILED: manifest mismatch in 'close validation' #\d+, rank {odd} "
                         r"\(exit 1\)$", text, re.M), run
        for rank in range(world):
            assert re.search(rf"^  rank {rank} \({re.escape(HOST)}:\d+\): saw the first failure "
                             r"\(manifest.mismatch in 'close validation' #\d+\), then ended: "
                             r"closed what was left", text, re.M), run
        document = json.load(open(report))
        assert document["outcome"] == "fail" and document["exit_code"] == 1, document
        failure = document["first_failure"]
        assert failure["kind"] == "manifest_mismatch" and failure["ranks"] == [odd], failure
        assert failure["seen_by"] == list(range(world)), failure
        assert failure["detail"]["index"] == 0 and failure["detail"]["rank"] == odd, failure


def check_sigterm():
    """torchrun's own teardown: SIGTERM to torchrun, which stops every worker with SIGTERM; rank
    0 reports what every rank was doing before the signal ends it."""
    run = Run(torchrun(2, ["--steps", "1000000"]), environment({"HMC_NAME": "stopped"}),
              bound=120)
    run.wait_for(r"--master-port \d+\)", 90)
    time.sleep(1.5)  # into the steps
    signalled = time.monotonic() - run.began
    os.kill(run.process.pid, 15)
    verdict_at, _ = run.wait_for(r"^# STOPPED: rank 0 was stopped by signal 15", 30)
    code = run.finish()
    text = run.text()
    assert code != 0, f"exit 0 after a SIGTERM:\n{run}"
    assert verdict_at - signalled <= 5.0, f"the report came {verdict_at - signalled:.2f} s after " \
                                          f"the signal:\n{run}"
    for rank in (0, 1):
        assert re.search(rf"^  rank {rank} \({re.escape(HOST)}:\d+\): stopped by signal 15", text,
                         re.M), run


def check_crash():
    """A rank that dies in the middle of its steps (exit 17): rank 0's report names it with its
    host, whether rank 0 saw the lost connection first or torchrun's SIGTERM."""
    run = Run(torchrun(2, ["--steps", "4000", "--crash", "1"]), environment({"HMC_NAME": "crash"}),
              bound=120)
    run.wait_for(r"# example: rank 1 crashes", 90)
    run.wait_for(r"^# (HUNG|STOPPED): ", 30)
    code = run.finish()
    text = run.text()
    assert code != 0, f"exit 0 after a crash:\n{run}"
    assert re.search(rf"^  rank 1 \({re.escape(HOST)}:\d+\): ", text, re.M), run


def rank_pid(name, rank):
    """The pid of the example process of rank `rank` of the mpirun job named `name` (HMC_NAME),
    found by its environment, or None."""
    wanted = {f"HMC_NAME={name}".encode(), f"OMPI_COMM_WORLD_RANK={rank}".encode()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as comm:
                if comm.read().strip() != os.path.basename(EXAMPLE)[:15]:
                    continue
            with open(f"/proc/{entry}/environ", "rb") as environ:
                if wanted <= set(environ.read().split(b"\0")):
                    return int(entry)
        except OSError:
            continue
    return None


def check_mpirun_killed_rank():
    """kill -9 of rank 2 of 4 while it waits in its close and rank 0 works alone: mpirun tears
    the job down (SIGCONT, SIGTERM 1 s later, SIGKILL 50 ms after it); rank 0 reports at the
    SIGCONT, before the SIGKILL that a report made at the SIGTERM did not outrun."""
    name = f"killed-{os.getpid()}"
    run = Run(mpirun(4, ["--steps", "20", "--skip-close", "0", "--linger", "60"]),
              environment({"HMC_NAME": name, "HMC_TIMEOUT": "30"}), bound=120)
    run.wait_for(r"# example: rank 0 skips its close", 90)
    for rank in (1, 2, 3):
        run.wait_for(rf"# example: rank {rank} closing its model", 30)
    time.sleep(0.5)  # into 'close validation'
    pid = rank_pid(name, 2)
    assert pid is not None, f"no process of rank 2 found:\n{run}"
    killed = time.monotonic() - run.began
    os.kill(pid, 9)
    verdict_at, _ = run.wait_for(r"^# STOPPED: mpirun began tearing the job down", 30)
    code = run.finish()
    text = run.text()
    assert code != 0, f"exit 0 after a rank was killed:\n{run}"
    assert verdict_at - killed <= 3.0, f"the report came {verdict_at - killed:.2f} s after the " \
                                       f"kill:\n{run}"
    host = re.escape(HOST)
    # Its process ended on rank 0's node: the evidence folder says so (not waited for).
    assert re.search(rf"^  rank 2 \({host}:{pid}\): no end: its process \({pid}\) has ended: it "
                     rf"exited, crashed or was killed; its heartbeat: waiting in 'close "
                     rf"validation' #\d+", text, re.M), run
    for rank in (1, 3):
        assert re.search(rf"^  rank {rank} \({host}:\d+\): (stopped by mpirun's teardown .* "
                         rf"while waiting in|hang in) 'close validation' #\d+", text, re.M), run
    assert re.search(rf"^  rank 0 \({host}:\d+\): stopped by mpirun's teardown", text, re.M), run


def check_mpirun_killed_in_join(transport):
    """kill -9 of rank 1 of 2 while rank 0 forms the world (its store is up, rank 1 never
    joins): mpirun tears the job down, and rank 0 says that the world did not form and why it
    stopped, once, with its document, instead of dying silently in the join."""
    tmp = tempfile.mkdtemp(prefix="hmc-embed-")
    try:
        report = os.path.join(tmp, "end.json")
        port = reserved_port()
        # Rank 1 kills itself once rank 0's store accepts connections: rank 0 is in its join.
        wrapper = ("if [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then for i in $(seq 1200); do "
                   f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && kill -9 $$; sleep 0.05; "
                   "done; fi; exec \"$@\"")
        command = mpirun(2, ["--steps", "4"])
        at = command.index(EXAMPLE)
        command[at:at] = ["/bin/bash", "-c", wrapper, "join-killer"]
        run = Run(command, environment({"HMC_NAME": "killed-in-join", "HMC_TIMEOUT": "4",
                                        "HMC_MASTER_ADDR": "127.0.0.1",
                                        "HMC_MASTER_PORT": str(port),
                                        "HMC_TRANSPORT": transport, "HMC_REPORT": report,
                                        "TMPDIR": tmp}),
                  bound=120)
        run.wait_for(r"^# STOPPED: the world did not form: rank 0 was stopped by signal 15", 60)
        code = run.finish()
        text = run.text()
        assert code != 0, f"exit 0 after a rank was killed:\n{run}"
        assert len(re.findall(r"^# (OK|FAILED|HUNG|STOPPED)\b", text, re.M)) == 1, run
        # The rank that never joined is named (read from rank 0's store), not rank 0.
        assert re.search(r"^# first failure: stopped in the world's join: rank 0 was stopped by "
                         r"signal 15 \(Terminated\) while the world formed; rank 1 had not joined "
                         rf"the store at 127\.0\.0\.1:{port}; mpirun stops every rank", text,
                         re.M), run
        document = json.load(open(report))
        assert document["exit_code"] == 143, document
        assert document["first_failure"]["kind"] == "stopped", document
        assert document["first_failure"]["stage"] == "join", document
        assert document["first_failure"]["ranks"] == [1], document
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_rank0_crash():
    """Rank 0 of 3 dies in the middle of its steps (exit 17) under torchrun: nobody is left to
    report through rank 0, so rank 1, the lowest rank of its node still alive, reports in its
    place from the evidence folder (the ranks' ends written beside the store), within the
    deadline + 2 s, and writes HMC_REPORT; the folder is removed."""
    tmp = tempfile.mkdtemp(prefix="hmc-embed-")  # TMPDIR: the evidence folder is made here
    try:
        check_rank0_crash_in(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_rank0_crash_in(tmp):
    report = os.path.join(tmp, "end.json")
    run = Run(torchrun(3, ["--steps", "4000", "--crash", "0"]),
              environment({"HMC_NAME": "rank0-crash", "HMC_TIMEOUT": str(DEADLINE_S),
                           "HMC_REPORT": report, "TMPDIR": tmp}),
              bound=120)
    crashed_at, _ = run.wait_for(r"# example: rank 0 crashes", 90)
    # HUNG, or STOPPED when torchrun's SIGTERM (after it saw rank 0 exit) came first.
    verdict_at, _ = run.wait_for(r"^# (HUNG|STOPPED): ", 30)
    code = run.finish()
    text = run.text()
    assert code != 0, f"exit 0 after rank 0 crashed:\n{run}"
    assert verdict_at - crashed_at <= DEADLINE_S + 2, \
        f"the report came {verdict_at - crashed_at:.2f} s after the crash:\n{run}"
    host = re.escape(HOST)
    found = re.search(r"^# hmc: rank 0's process \((\d+)\) has ended without reporting; rank 1, "
                      r"the lowest rank of its node still alive, reports in its place", text, re.M)
    assert found, run
    pid = found.group(1)
    assert re.search(rf"^  rank 0 \({host}:{pid}\): no end: its process \({pid}\) has ended: it "
                     rf"exited, crashed or was killed", text, re.M), run
    for rank in (1, 2):
        assert re.search(rf"^  rank {rank} \({host}:\d+\): (hang|stopped)", text, re.M), run
    document = json.load(open(report))
    assert document["outcome"] == "hang" and document["exit_code"] in (3, 143), document
    assert [r["status"] for r in document["ranks"]][0] == "missing", document
    assert not [f for f in os.listdir(tmp) if f.startswith("hmc-evidence-")], os.listdir(tmp)


CASES = [
    ("torchrun_2_clean", lambda: check_clean("torchrun", 2)),
    ("mpirun_2_clean", lambda: check_clean("mpirun", 2)),
    ("mpirun_4_clean", lambda: check_clean("mpirun", 4)),
    ("torchrun_2_log_level_info", check_log_level),
    ("torchrun_2_skipped_close_with_status", lambda: check_skipped_close("torchrun", 2, True)),
    ("mpirun_2_skipped_close", lambda: check_skipped_close("mpirun", 2, False)),
    ("mpirun_3_skipper_at_the_end", lambda: check_skipper_at_the_end("mpirun", 3)),
    ("torchrun_2_skipper_at_the_end", lambda: check_skipper_at_the_end("torchrun", 2)),
    ("mpirun_3_reordered_close", lambda: check_reordered_close("mpirun", 3)),
    ("torchrun_2_reordered_close", lambda: check_reordered_close("torchrun", 2)),
    ("torchrun_2_sigterm", check_sigterm),
    ("torchrun_2_crash", check_crash),
    ("mpirun_4_killed_rank", check_mpirun_killed_rank),
    ("mpirun_2_killed_in_join_store", lambda: check_mpirun_killed_in_join("store")),
    ("mpirun_2_killed_in_join_tcp", lambda: check_mpirun_killed_in_join("tcp")),
    ("torchrun_3_rank0_crash", check_rank0_crash),
]


def main():
    only = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
    return run_cases(CASES, only=only)


if __name__ == "__main__":
    sys.exit(main())
