#!/usr/bin/python3
"""hmc-run under the real launchers, and ranks on several "hosts" (CTest label multirank).

Usage: test_launchers.py HMC_RUN SOURCE_DIR [-k NAME] [--no-teardown-cases]

Real launchers at 2 and 4 ranks (torchrun: quickstart at 4, the skipped close at 2):
  - torchrun: Debian's torch 1.13 through tests/support/torchrun (its Python 3.11 workaround),
    with a c10d rendezvous on a free 127.0.0.1 port (--standalone would take the fixed 29400);
  - mpirun (openmpi-bin), with no --master-addr/--master-port: one node needs no flags.
  quickstart passes (exit 0, a report with every rank); an unexpected skipped close hangs
  (exit 3, the diagnosis names the rank that never arrived and the stage).
Hosts (simulated launcher variables, each process one rank): the master on 127.0.0.2, ranks
advertising their own loopback alias through HMC_ADVERTISE_ADDR, for tcp and store; and the
connect faults: no store at the master, a silent listener on the master port, a taken master
port, an advertised address that is not this host's.

The teardown cases check the evidence that survives the launcher's teardown: a crashed rank
(the diagnosis printed, --report naming the dead rank and where every other rank was),
SIGTERM to the launcher, and kill -9 of rank 0, the store's host (the lowest surviving rank
reports from the local evidence folder). --no-teardown-cases leaves them out.

Exit 0 when every case passed, 1 when one failed, 77 (CTest skip) when none failed but a
launcher is not installed (the reason printed). Every wait is bounded; a launcher still
running at its bound is killed with its whole process group. Python 3 standard library only.
"""

import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import shard  # noqa: E402
from cases import Skip, run_cases  # noqa: E402
from ports import on_a_free_port, reserved_port  # noqa: E402
from torch_probe import torchrun_missing  # noqa: E402

HMC_RUN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/app/hmc-run")
SOURCE_DIR = os.path.abspath(sys.argv[2] if len(sys.argv) > 2 else ".")
ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
SHARD = shard.parse(sys.argv)  # --shard K/N: every N-th case, from the K-th
TEARDOWN = "--no-teardown-cases" not in sys.argv
TMP = tempfile.mkdtemp(prefix="hmc-launchers-")
TORCHRUN = os.path.join(SOURCE_DIR, "tests", "support", "torchrun")
QUICKSTART = os.path.join(SOURCE_DIR, "scenarios", "quickstart.json")
PYTHON = "/usr/bin/python3"

# Variables of a launcher around this test must not leak into the launches it makes.
LAUNCH_VARS = re.compile(r"^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|"
                         r"GROUP_RANK|TORCHELASTIC_.*|SLURM_.*|OMPI_.*|PMI_.*|PMIX_.*|HMC_.*)$")


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not LAUNCH_VARS.match(k)}
    # What the launches leave in TMPDIR (torchrun's torchelastic_* logs, evidence folders of a
    # killed run) goes with TMP, unless a case gives its own folder to check.
    env["TMPDIR"] = TMP
    env[OWNER_VAR] = TMP  # marks this test's processes (hmc_processes)
    env.update(extra or {})
    return env


def scenario(name, steps, world_size=2, timeout_s=3):
    path = os.path.join(TMP, name + ".json")
    with open(path, "w") as f:
        json.dump({"format": "hmc-scenario/1", "name": name, "world_size": world_size,
                   "device": "cpu", "timeout_s": timeout_s, "steps": steps}, f)
    return path


def net_namespace(pid="self"):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


# Set in every launch's environment (clean_env) to this run's own folder: the launchers pass
# it on to the ranks, and it tells this test's hmc-run processes from those of the tests that
# CTest runs beside it with the same binary (check_sigterm asserts that the ranks carry it).
OWNER_VAR = "HMC_TEST_LAUNCHERS_OWNER"


def hmc_processes():
    """Pids of live hmc-run processes started from this build (not zombies) by this test: in
    this process's network namespace (the cluster tests start the same binary on test hosts of
    their own namespaces) and with this run's OWNER_VAR in their environment (the e2e tests
    beside it start it here too)."""
    ours = net_namespace()
    mark = f"{OWNER_VAR}={TMP}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv0 = f.read().split(b"\0")[0]
            if state == "Z" or argv0 != HMC_RUN.encode() or net_namespace(entry) != ours:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark in f.read().split(b"\0"):
                    out.append(int(entry))
        except (OSError, IndexError):
            continue
    return out


def descendants(pid):
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - out
        out |= frontier
    return out


class Run:
    def __init__(self, command, returncode, stdout, stderr, seconds, report):
        self.command, self.returncode = command, returncode
        self.stdout, self.stderr, self.seconds, self.report = stdout, stderr, seconds, report

    def __repr__(self):
        return (f"{' '.join(self.command)}\nexit {self.returncode} after {self.seconds:.1f} s"
                f"\n--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")


def start(command, env=None):
    return subprocess.Popen(command, env=clean_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=TMP)


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass


def finish(proc, command, began, bound, report_path):
    try:
        stdout, stderr = proc.communicate(timeout=max(1, began + bound - time.monotonic()))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        stdout, stderr = proc.communicate()
        raise AssertionError(f"still running after {bound} s: {' '.join(command)}\n"
                             f"{stdout[-3000:]}\n{stderr[-3000:]}")
    report = None
    if report_path and os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    return Run(command, proc.returncode, stdout, stderr, time.monotonic() - began, report)


def report_path(tag):
    return os.path.join(TMP, f"report-{tag}-{time.monotonic_ns()}.json")


def launch(command, bound=90, env=None, report=None):
    began = time.monotonic()
    return finish(start(command, env), command, began, bound, report)


# --- the real launchers -------------------------------------------------------------------

def torchrun_command(world, args):
    missing = torchrun_missing(PYTHON)
    if missing:
        raise Skip(missing)
    return [PYTHON, TORCHRUN, "--nnodes", "1", "--nproc_per_node", str(world),
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{reserved_port()}",
            "--rdzv_id", f"hmc-test-{os.getpid()}-{time.monotonic_ns()}",
            "--monitor_interval", "0.5",  # sees a worker's exit in 0.5 s rather than 5 s
            "--no_python",
            HMC_RUN] + args


def mpirun_command(world, args):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise Skip("mpirun: openmpi-bin is not installed (scripts/setup installs it)")
    # Root needs --allow-run-as-root; 4 ranks on 2 cores need --oversubscribe. No master flags:
    # on one node hmc-run finds 127.0.0.1 and a port derived from the job id by itself.
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return [mpirun] + root + ["--oversubscribe", "-np", str(world), HMC_RUN] + args


LAUNCHERS = {"torchrun": torchrun_command, "mpirun": mpirun_command}


def assert_all_ranks(run, world):
    assert run.report is not None, f"no report was written:\n{run}"
    assert [r["rank"] for r in run.report["ranks"]] == list(range(world)), run.report["ranks"]


def assert_no_hmc_left(before, within=10.0):
    end = time.monotonic() + within
    while True:
        left = sorted(set(hmc_processes()) - before)
        if not left:
            return
        assert time.monotonic() < end, f"hmc-run processes {left} outlived their launcher"
        time.sleep(0.1)


def check_quickstart(launcher, world):
    before = set(hmc_processes())
    path = report_path(f"{launcher}-quickstart-{world}")
    run = launch(LAUNCHERS[launcher](world, [QUICKSTART, "--report", path]), report=path)
    assert_rank0_exit(launcher, run, 0)
    assert f"# hmc-run: quickstart ({world} ranks, transport tcp" in run.stdout, run
    assert "# OK: 1 scenario passed" in run.stdout, run
    # Rank 0 says when the world formed and where `hmc-run status` attaches.
    assert re.search(rf"^# hmc-run: world of scenario 'quickstart' \({world} ranks\) joined "
                     rf"\({launcher}, transport tcp\); store at [\w.]+:\d+ \(attach: hmc-run "
                     r"status --master-addr [\w.]+ --master-port \d+\)$", run.stderr, re.M), run
    assert run.report["outcome"] == "pass", run
    assert_all_ranks(run, world)
    assert_no_hmc_left(before)


def skipped_close(world):
    """The last rank skips a close_all that every other rank runs, unexpectedly."""
    return scenario(f"skipped-close-{world}", [
        {"op": "create", "module": "a"},
        {"op": "forward", "module": "a"},
        {"op": "close_all", "ranks": list(range(world - 1))},
        {"op": "check", "ranks": [world - 1], "groups": 1},
    ], world_size=world, timeout_s=2)


def assert_rank0_exit(launcher, run, code):
    """mpirun exits with the first failing rank's status; torchrun exits 1 for any failed
    worker and logs each one's status."""
    if launcher == "mpirun" or code == 0:
        assert run.returncode == code, run
    else:
        assert run.returncode == 1, run
        assert re.search(rf"failed \(exitcode: {code}\) local_rank: 0 ", run.stderr), run


def check_skipped_close(launcher, world):
    before = set(hmc_processes())
    path = report_path(f"{launcher}-skipped-{world}")
    run = launch(LAUNCHERS[launcher](world, [skipped_close(world), "--report", path]), report=path)
    assert_rank0_exit(launcher, run, 3)
    assert run.report["outcome"] == "hang", run
    assert_all_ranks(run, world)
    diagnosis = run.report["hang"]["diagnosis"]
    missing = world - 1
    assert re.search(rf"rank {missing} never arrived: last completed 'recycle' #\d+ \(step 1\)",
                     diagnosis), diagnosis
    for rank in range(missing):
        assert re.search(rf"rank {rank} waits in 'close validation' #\d+ \(step 2\)", diagnosis), \
            diagnosis
    assert f"rank {missing} never arrived" in run.stdout, run  # the console says it too
    assert_no_hmc_left(before)


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


# torchrun once at each size: its agent costs 2.4 s of CPU to start (it imports torch), and
# the cases at the other size run under mpirun below and across hosts (cluster_hosts).
@test
def torchrun_quickstart_passes_at_4_ranks():
    check_quickstart("torchrun", 4)


@test
def torchrun_skipped_close_names_the_missing_rank_at_2():
    check_skipped_close("torchrun", 2)


@test
def mpirun_quickstart_passes_at_2_and_4_ranks_without_master_flags():
    for world in (2, 4):
        check_quickstart("mpirun", world)


@test
def mpirun_skipped_close_names_the_missing_rank_at_2_and_4():
    for world in (2, 4):
        check_skipped_close("mpirun", world)


# --- evidence that survives the launcher's teardown (--teardown-cases) --------------------

def crash_scenario(world):
    if world == 2:
        return os.path.join(SOURCE_DIR, "scenarios", "crashed-rank.json")
    # Rank 1 sleeps before it crashes, so that every other rank waits in close_all's collective
    # when the launcher, seeing rank 1's exit, stops them (check_crash expects each to be
    # found waiting). Without it, a rank descheduled on a loaded machine for the launcher's
    # monitor interval (torchrun: 0.5 s here) was stopped before it reached the collective,
    # and the diagnosis rightly said so (one CI run in many, 4 ranks under torchrun).
    return scenario(f"crashed-rank-{world}", [
        {"op": "create", "module": "a"},
        {"op": "forward", "module": "a"},
        {"op": "sleep", "seconds": 1, "ranks": [1]},
        {"op": "fault", "kind": "crash", "ranks": [1]},
        {"op": "close_all", "expect": "hang"},
        {"op": "check", "groups": 0},
    ], world_size=world, timeout_s=2)


def check_crash(launcher, world):
    before = set(hmc_processes())
    path = report_path(f"{launcher}-crash-{world}")
    # --timeout 10: before --join-timeout the scenario's 2 s also bounded how long a rank waited
    # for rank 0's store at start, and 4 ranks loading LibTorch on 2 busy cores can differ by
    # more than that (rank 1 exited "found no c10d store ... within 2 s" in one of 12 mpirun
    # rounds here); the join deadline (300 s by default) bounds that now. rank 1's death is
    # seen at once anyway (its closed connection).
    run = launch(LAUNCHERS[launcher](world, [crash_scenario(world), "--timeout", "10",
                                             "--report", path]),
                 report=path)
    assert run.returncode != 0, run  # the launcher reports the dead rank
    text = run.stdout + run.stderr
    assert re.search(r"rank 1 (exited|was killed|crashed)", text), f"no diagnosis printed:\n{run}"
    assert_all_ranks(run, world)
    # The scenario's fault step and expected hang make a clean report "pass" (as with hmc-run's
    # own launcher); a rank stopped by the launcher's SIGTERM first makes it "fail" or "hang".
    assert run.report["outcome"] in ("pass", "fail", "hang"), run.report["outcome"]
    assert run.report["ranks"][1].get("crashed"), run.report["ranks"][1]
    diagnosis = run.report["hang"]["diagnosis"]
    assert re.search(r"rank 1 (exited|was killed|crashed)", diagnosis), diagnosis
    for rank in range(world):
        if rank != 1:
            assert re.search(rf"rank {rank} waits? in '[a-z ]+'", diagnosis), diagnosis
    assert_no_hmc_left(before)


def wait_for_evidence_pids(proc, tmpdir, world, bound=90):
    """Every rank's pid, from rank 0's evidence folder under `tmpdir` (each rank writes its pid
    there once it joined the store, so it is past LibTorch's loading and the rendezvous)."""
    end = time.monotonic() + bound
    pid_of = {}
    while len(pid_of) < world:
        assert time.monotonic() < end and proc.poll() is None, "the ranks did not start"
        for pid_file in glob.glob(os.path.join(tmpdir, "hmc-evidence-*", "rank*.pid")):
            try:
                with open(pid_file) as f:
                    pid_of[int(os.path.basename(pid_file)[4:-4])] = int(f.read())
            except (OSError, ValueError):
                pass
        time.sleep(0.1)
    return pid_of


def _listening_ports(pid):
    """The TCP ports process `pid` listens on (/proc/net/tcp and tcp6, its socket fds)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    except OSError:
        return []
    ports = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.append(int(fields[1].split(":")[1], 16))
    return sorted(set(ports))


def _status(port):
    """`hmc-run status --json` on 127.0.0.1:port: the document, or None."""
    try:
        proc = subprocess.run([HMC_RUN, "status", "--master-port", str(port), "--json",
                               "--timeout", "5"], env=clean_env(), capture_output=True,
                              text=True, timeout=60)
        return json.loads(proc.stdout) if proc.returncode in (0, 3) and proc.stdout.strip() \
            else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def wait_for_ranks(proc, rank0_pid, world, ready, what, bound=90):
    """Polls `hmc-run status` until ready(ranks) holds for the heartbeats of all `world` ranks.
    Under a launcher the test does not know the store's port (torchrun and hmc-run pick it):
    it is one of rank 0's listening ports, the one `hmc-run status` can read."""
    end = time.monotonic() + bound
    port, last = None, None
    while True:
        assert time.monotonic() < end and proc.poll() is None, \
            f"the ranks were not seen {what} within {bound} s (last status: {last})"
        for candidate in ([port] if port else _listening_ports(rank0_pid)):
            doc = _status(candidate)
            if doc is not None:
                port, last = candidate, doc.get("ranks")
                break
        if last and len(last) == world and ready(last):
            return
        time.sleep(0.2)


def check_sigterm(launcher, world):
    before = set(hmc_processes())
    tmpdir = tempfile.mkdtemp(prefix=f"sigterm-{launcher}-{world}-", dir=TMP)
    path = report_path(f"{launcher}-sigterm-{world}")
    long_sleep = scenario(f"long-sleep-{world}", [
        {"op": "create", "module": "a"},
        {"op": "forward", "module": "a"},
        {"op": "sleep", "seconds": 60},
    ], world_size=world, timeout_s=90)
    command = LAUNCHERS[launcher](world, [long_sleep, "--report", path])
    proc = start(command, env={"TMPDIR": tmpdir})
    try:
        pid_of = wait_for_evidence_pids(proc, tmpdir, world)
        # Every rank past its first steps, sleeping in step 2 (its heartbeat says so).
        wait_for_ranks(proc, pid_of[0], world,
                       lambda ranks: all(r.get("step") == 2 for r in ranks),
                       "sleeping in step 2")
        # The ranks carry OWNER_VAR through this launcher, so assert_no_hmc_left sees them.
        unmarked = set(pid_of.values()) - set(hmc_processes())
        assert not unmarked, f"{launcher}: ranks {sorted(unmarked)} lack {OWNER_VAR}"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        run = finish(proc, command, sent, 90, path)  # bounded from the signal: no start-up
    except BaseException:
        kill_group(proc)
        proc.communicate()
        raise
    took = time.monotonic() - sent
    assert took < 30, f"{launcher} took {took:.1f} s to stop after SIGTERM:\n{run}"
    assert_all_ranks(run, world)
    assert run.report["outcome"] in ("fail", "hang", "interrupted"), run.report["outcome"]
    for rank in run.report["ranks"]:
        assert len(rank.get("steps", [])) >= 2, f"rank {rank['rank']} lost its steps: {rank}"
    assert_no_hmc_left(before)
    left = glob.glob(os.path.join(tmpdir, "hmc-evidence-*"))
    assert not left, f"the evidence folder outlived the job: {left}"


def check_store_host_dies(launcher, world, transport):
    """kill -9 of rank 0 (the store's host) in the middle of a churn of collectives: the lowest
    surviving rank reports from the evidence folder's files (rank_process.hpp)."""
    before = set(hmc_processes())
    tmpdir = tempfile.mkdtemp(prefix=f"store-host-{launcher}-{world}-", dir=TMP)
    path = report_path(f"{launcher}-store-host-{transport}-{world}")
    churn = scenario(f"churn-{world}", [
        {"op": "repeat", "count": 1000000, "label": "churn", "steps": [
            {"op": "create", "module": "m"},
            {"op": "forward", "module": "m"},
            {"op": "drop", "module": "m"},
            {"op": "close_all"},
        ]},
    ], world_size=world, timeout_s=5)
    command = LAUNCHERS[launcher](world, [churn, "--transport", transport, "--report", path])
    proc = start(command, env={"TMPDIR": tmpdir})
    try:
        pid_of = wait_for_evidence_pids(proc, tmpdir, world)
        # Every rank inside the churn with a completed collective (its heartbeat says so).
        wait_for_ranks(proc, pid_of[0], world,
                       lambda ranks: all(r.get("step") == 0 and r.get("last_completed")
                                         for r in ranks),
                       "inside the churn")
        os.kill(pid_of[0], signal.SIGKILL)
        run = finish(proc, command, time.monotonic(), 90, path)  # from the kill: no start-up
    except BaseException:
        kill_group(proc)
        proc.communicate()
        raise
    assert run.returncode != 0, run
    assert_all_ranks(run, world)
    ranks = run.report["ranks"]
    assert ranks[0].get("crashed"), ranks[0]
    for rank in range(1, world):
        steps = ranks[rank].get("steps", [])
        assert any(s["status"] == "hang" for s in steps), f"rank {rank} lost its steps: {ranks}"
    diagnosis = run.report["hang"]["diagnosis"]
    assert diagnosis.startswith("rank 0 crashed ("), diagnosis
    for rank in range(1, world):
        assert re.search(rf"rank {rank} waits in '[a-zA-Z ]+' #\d+", diagnosis), diagnosis
    assert "# hang: rank 0 crashed" in run.stdout, f"no diagnosis printed:\n{run}"
    assert_no_hmc_left(before)
    left = glob.glob(os.path.join(tmpdir, "hmc-evidence-*"))
    assert not left, f"the evidence folder outlived the job: {left}"


if TEARDOWN:
    @test
    def torchrun_crash_is_diagnosed_and_reported_at_2_and_4():
        for world in (2, 4):
            check_crash("torchrun", world)

    @test
    def torchrun_sigterm_keeps_the_evidence_at_2_and_4():
        for world in (2, 4):
            check_sigterm("torchrun", world)

    @test
    def torchrun_store_host_killed_lowest_survivor_reports_tcp_2_and_store_4():
        check_store_host_dies("torchrun", 2, "tcp")
        check_store_host_dies("torchrun", 4, "store")

    @test
    def mpirun_store_host_killed_lowest_survivor_reports_store_2_and_tcp_4():
        check_store_host_dies("mpirun", 2, "store")
        check_store_host_dies("mpirun", 4, "tcp")

# Open MPI's teardown after a rank's death (seen with strace): SIGCONT to every rank, SIGTERM 1 s
# later, SIGKILL about 50 ms after that. The survivors therefore stop waiting for a rank whose
# process they see gone (the evidence folder's pid files) and report within that second, before
# any signal; the SIGTERM path alone (50 ms) lost the report at 4 ranks in 4 of 10 runs here.
def check_killed_before_its_join(transport):
    """kill -9 of rank 2 of 3 under mpirun once rank 0's store accepts connections, before rank
    2 joined it: mpirun tears the job down while rank 0 forms the world. Rank 0's report names
    the rank that never joined (read from its store), as stopped in the join, not every rank as
    crashed."""
    before = set(hmc_processes())
    path = report_path(f"killed-before-join-{transport}")
    port = reserved_port()
    wrapper = ("if [ \"$OMPI_COMM_WORLD_RANK\" = 2 ]; then for i in $(seq 1200); do "
               f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && kill -9 $$; sleep 0.05; "
               "done; fi; exec \"$@\"")
    command = mpirun_command(3, [QUICKSTART, "--transport", transport, "--report", path,
                                 "--master-addr", "127.0.0.1", "--master-port", str(port)])
    at = command.index(HMC_RUN)
    command[at:at] = ["/bin/bash", "-c", wrapper, "join-killer"]
    run = launch(command, report=path)
    assert run.returncode != 0, run
    assert run.report is not None, f"no report was written:\n{run}"
    first = run.report["first_failure"]
    assert first["kind"] == "stopped" and first["stage"] == "join", first
    # Rank 2 never joined; rank 1 may not have either (it loads LibTorch as rank 0 does).
    assert 2 in first["ranks"] and 0 not in first["ranks"], first
    # "rank 2" alone (rank 1 had joined), else "ranks [1, 2]".
    assert re.search(r"^# first failure: stopped in the world's join: "
                     r"(rank 2|ranks \[1, 2\]) had "
                     rf"not joined the store at 127\.0\.0\.1:{port} when rank 0 was stopped by "
                     r"signal 15", run.stdout, re.M), run
    ranks = run.report["ranks"]
    assert not any(r.get("crashed") for r in ranks), ranks  # nobody is known to have crashed
    assert ranks[2].get("joined") is False and ranks[2].get("stopped"), ranks[2]
    assert ranks[0].get("stopped") and "joined" not in ranks[0], ranks[0]
    assert_no_hmc_left(before)


if TEARDOWN:
    @test
    def mpirun_rank_killed_before_its_join_is_named_store_and_tcp():
        check_killed_before_its_join("store")
        check_killed_before_its_join("tcp")

    @test
    def mpirun_crash_is_diagnosed_and_reported_at_2_and_4():
        for world in (2, 4):
            check_crash("mpirun", world)

    @test
    def mpirun_sigterm_keeps_the_evidence_at_2_and_4():
        for world in (2, 4):
            check_sigterm("mpirun", world)


# --- hosts: simulated launcher variables, one process per rank -----------------------------

def launch_ranks(world, env_of, args, bound=60):
    """Starts one hmc-run per rank with env_of(rank); returns [(exit, stdout, stderr)]."""
    procs = [start([HMC_RUN] + list(args), env_of(rank)) for rank in range(world)]
    began = time.monotonic()
    out = []
    for proc in procs:
        try:
            stdout, stderr = proc.communicate(timeout=max(1, began + bound - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                kill_group(p)
            # What every rank had printed says where it waited (HMC_LOG_LEVEL=info).
            outputs = [p.communicate() for p in procs]
            where = "\n".join(f"rank {r}: exit {p.returncode}\n{o[-1500:]}\n{e[-3000:]}"
                              for r, (p, (o, e)) in enumerate(zip(procs, outputs)))
            raise AssertionError(f"a rank still ran after {bound} s; the ranks' output:\n{where}")
        out.append((proc.returncode, stdout, stderr))
    return out


# Rank -> the loopback "host" it runs on: ranks 0 and 1 share the master's host 127.0.0.2.
HOSTS = {0: "127.0.0.2", 1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.4"}


def torchrun_vars(rank, world, port, extra=None):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.2",
           "MASTER_PORT": str(port), "HMC_LOG_LEVEL": "info"}
    env.update(extra or {})
    return env


def check_hosts(transport):
    world = 4
    # A short join deadline: when rank 0 lost its port to another test, the others end with
    # their own message inside launch_ranks' bound, and on_a_free_port takes another port.
    results = on_a_free_port(lambda port: launch_ranks(world, lambda r: torchrun_vars(
        r, world, port, {"HMC_ADVERTISE_ADDR": HOSTS[r]}),
        [QUICKSTART, "--transport", transport, "--join-timeout", "30"]), host="127.0.0.2")
    where = "\n".join(f"rank {r}: exit {code}\n{out[-1500:]}\n{err[-1500:]}"
                      for r, (code, out, err) in enumerate(results))
    assert all(code == 0 for code, _, _ in results), where
    assert f"({world} ranks, transport {transport}" in results[0][1], where
    assert "# outcome: pass" in results[0][1], where
    if transport == "tcp":
        # Each rank bound its own alias (a listener on 127.0.0.3 is reachable only there, so
        # the pass shows the peers connected to the announced addresses).
        for rank, (_, _, err) in enumerate(results):
            assert re.search(rf"rank {rank} of the tcp transport listens on {re.escape(HOSTS[rank])}"
                             rf" port \d+ \(HMC_ADVERTISE_ADDR={re.escape(HOSTS[rank])}\)", err), where
            # The peer on its address (ranks 0 and 1 share 127.0.0.2) over a Unix-domain
            # socket, the others over TCP.
            others = [r for r in range(world) if HOSTS[r] != HOSTS[rank]]
            mates = [r for r in range(world) if HOSTS[r] == HOSTS[rank] and r != rank]
            line = f"rank {rank} of the tcp transport: ranks {others} over TCP" + (
                f", ranks {mates} over a Unix-domain socket (this host)" if mates else "")
            assert line + "\n" in err, f"no '{line}':\n{where}"


@test
def tcp_ranks_on_several_hosts_advertise_their_own_address():
    check_hosts("tcp")


@test
def store_ranks_on_several_hosts_meet_at_a_master_that_is_not_127_0_0_1():
    check_hosts("store")


def one_rank(env, timeout_s, bound):
    began = time.monotonic()
    tmpdir = tempfile.mkdtemp(prefix="one-rank-", dir=TMP)
    # Connecting is part of joining: the join deadline bounds it (its default is minutes).
    (code, out, err), = launch_ranks(1, lambda _: dict(env, TMPDIR=tmpdir),
                                     [QUICKSTART, "--timeout", str(timeout_s),
                                      "--join-timeout", str(timeout_s)],
                                     bound=bound)
    seconds = time.monotonic() - began
    # A rank that could not form its world leaves nothing behind: rank 0 made its evidence
    # folder before joining, and left it in /tmp whenever the join failed.
    left = os.listdir(tmpdir)
    assert not left, f"left in TMPDIR by a rank that did not join: {left}\n{err}"
    return code, out, err, seconds


# Without the connect probe c10d waits far longer than the deadline (a silent listener blocked
# a rank until the listener went away); the bound leaves room for a slow start on a busy machine.
CONNECT_DEADLINE_S = 2
CONNECT_BOUND_S = 20


@test
def no_store_at_the_master_fails_within_the_deadline_naming_address_and_port():
    port = reserved_port("127.0.0.9")  # held, and nothing listens there
    code, out, err, seconds = one_rank(torchrun_vars(1, 2, port, {"MASTER_ADDR": "127.0.0.9"}),
                                       CONNECT_DEADLINE_S, 60)
    assert code != 0, (code, out, err)
    assert f"127.0.0.9:{port}" in err and "MASTER_ADDR" in err, err
    assert seconds < CONNECT_BOUND_S, f"{seconds:.1f} s:\n{err}"


@test
def a_silent_listener_on_the_master_port_does_not_block_past_the_deadline():
    with socket.socket() as listener:
        listener.bind(("127.0.0.2", 0))
        listener.listen(16)  # accepts (the kernel's backlog) and never answers
        port = listener.getsockname()[1]
        code, out, err, seconds = one_rank(torchrun_vars(1, 2, port), CONNECT_DEADLINE_S, 60)
    assert code != 0, (code, out, err)
    assert f"127.0.0.2:{port}" in err, err
    assert "did not answer as a c10d store" in err, err
    assert seconds < CONNECT_BOUND_S, f"{seconds:.1f} s:\n{err}"


def listener_that_hangs_up(close_listener_first):
    """A listener on 127.0.0.2 that accepts connections and closes each without a word; with
    `close_listener_first`, it takes one connection, stops listening, then hangs up (a store
    whose host dies while a rank connects). Returns (port, stop)."""
    import threading
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    stopped = threading.Event()

    def serve():
        while not stopped.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            if close_listener_first:
                listener.close()
                conn.close()
                return
            conn.close()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def stop():
        stopped.set()
        thread.join(5)
    return port, stop


def rank_against_a_listener_that_hangs_up(close_listener_first):
    """One rank joining a master whose listener hangs up (listener_that_hangs_up): it must fail
    within the connect bound. Returns (port, stderr)."""
    port, stop = listener_that_hangs_up(close_listener_first)
    try:
        code, out, err, seconds = one_rank(torchrun_vars(1, 2, port), CONNECT_DEADLINE_S, 60)
    finally:
        stop()
    assert code != 0, (code, out, err)
    assert seconds < CONNECT_BOUND_S, f"{seconds:.1f} s:\n{err}"
    return port, err


@test
def a_store_that_goes_away_while_a_rank_connects_is_named_as_gone():
    # The probe's connection is closed unanswered and nothing listens any more: the store's host
    # died, which the message says, instead of blaming "another service".
    port, err = rank_against_a_listener_that_hangs_up(close_listener_first=True)
    assert f"the c10d store at 127.0.0.2:{port} went away while this rank connected" in err, err
    assert "another service" not in err, err


@test
def a_listener_that_hangs_up_unanswered_is_named_as_another_service():
    port, err = rank_against_a_listener_that_hangs_up(close_listener_first=False)
    # A close or a reset (as the kernel delivers it), both with the other-service wording.
    assert re.search(rf"the listener at 127\.0\.0\.2:{port} (closed the connection instead of "
                     rf"answering|failed the c10d store's handshake)", err), err
    assert "another service holds that port" in err and "went away" not in err, err
    assert "internal error" not in err, err


@test
def a_taken_master_port_names_the_port_and_what_to_do():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, out, err, _ = one_rank(torchrun_vars(0, 2, port, {"MASTER_ADDR": "127.0.0.1"}),
                                     CONNECT_DEADLINE_S, 60)
    assert code != 0, (code, out, err)
    assert f"port {port} is already in use" in err and "--master-port" in err, err
    assert "Traceback" not in err and "terminate called" not in err, err


@test
def an_advertised_address_of_another_host_is_refused_by_name():
    port = reserved_port("127.0.0.2")
    env = torchrun_vars(0, 1, port, {"HMC_ADVERTISE_ADDR": "192.0.2.77"})
    code, out, err, _ = one_rank(env, CONNECT_DEADLINE_S, 60)
    assert code != 0, (code, out, err)
    assert "192.0.2.77" in err and "HMC_ADVERTISE_ADDR" in err, err
    assert "not an address of this host" in err, err


def main():
    picked = shard.pick([fn for fn in TESTS if not ONLY or ONLY in fn.__name__], SHARD)
    if not TEARDOWN:
        print("# not run: the crash and SIGTERM-to-the-launcher cases (pass --teardown-cases)")
    return run_cases([(fn.__name__, fn) for fn in picked], only=ONLY,
                     cleanup=lambda: shutil.rmtree(TMP, ignore_errors=True))


if __name__ == "__main__":
    sys.exit(main())
