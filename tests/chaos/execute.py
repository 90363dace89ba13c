"""Executions of one chaos plan (scripts/chaos, docs/chaos.md): hmc-run on thread ranks or
local rank processes, the plan driver (a program on hmc::joinWorld) under mpirun or torchrun,
the reference runner, the merge and replay of a recording; and faults from outside (SIGSTOP,
SIGKILL of a rank process at a random moment).

Every process an execution starts carries CHAOS_MARK=<token> in its environment, so that what
it leaves behind is found by its environment (/proc/PID/environ), not by its name; TMPDIR is a
folder of the execution's own, which must be empty when it ends."""

import json
import os
import re
import signal
import subprocess
import threading
import time

# The verdict lines: the world end's (OK, FAILED, HUNG, STOPPED) and hmc-run's (OK, FAILED,
# HUNG, and INTERRUPTED when a signal, e.g. a launcher's teardown, stopped it).
VERDICT = re.compile(r"^# (OK|FAILED|HUNG|STOPPED|INTERRUPTED)\b", re.M)
HARD_LIMIT_S = 120  # an execution still running after this is killed (and the run is wrong)


class Tools:
    def __init__(self, root, hmc_run, driver, oracle, torchrun):
        self.root, self.hmc_run, self.driver = root, hmc_run, driver
        self.oracle, self.torchrun = oracle, torchrun


class Execution:
    """What one execution left: exit code, output, its document, times, leftovers."""

    def __init__(self, name, folder):
        self.name, self.folder = name, folder
        self.command = []
        self.code = None
        self.output = ""
        self.document = None
        self.document_error = None
        self.start = self.end = None
        self.killed_by_harness = False
        self.fault = None  # {"kind", "rank", "pid", "at", "seconds", "delivered", "why"}
        self.ended_before_fault = False
        self.joined_at = None  # when the world's join line appeared in the output
        self.verdict_at = None  # when the first verdict line appeared in the output
        self.leftover_processes = []
        self.leftover_files = []

    @property
    def wall(self):
        return (self.end or time.monotonic()) - (self.start or time.monotonic())

    def verdict_lines(self):
        return VERDICT.findall(self.output)


def _environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def marked(token):
    """pid -> environment of every live process carrying CHAOS_MARK=token."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        env = _environ(entry)
        if env and env.get("CHAOS_MARK") == token and _state(entry) not in (None, "Z"):
            found[int(entry)] = env
    return found


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def rank_pids(token, program):
    """rank -> pid of the rank processes of the execution marked `token` whose executable
    is `program` (hmc-run's rank processes, or the driver under a launcher)."""
    ranks = {}
    for pid, env in marked(token).items():
        try:
            exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            continue
        if exe != os.path.basename(program):
            continue
        for key in ("OMPI_COMM_WORLD_RANK", "RANK", "HMC_RANK"):
            if key in env:
                ranks[int(env[key])] = pid
                break
    return ranks


# joinWorld's (the driver's) line, and hmc-run's rank 0 under a launcher.
JOINED = re.compile(r"^# (hmc: world '.*' of \d+ ranks|hmc-run: world of scenario '.*' \(\d+ "
                    r"ranks\)) joined", re.M)


class FaultPlan:
    """A fault from outside: `kind` none, sigstop or sigkill; `rank`; `delay` seconds after
    `after` ("pids": the rank processes are first seen; "join": the world's join line is
    printed); `seconds` how long a SIGSTOP lasts."""

    def __init__(self, kind, rank=None, delay=0.0, seconds=0.0, after="pids"):
        self.kind, self.rank, self.delay, self.seconds = kind, rank, delay, seconds
        self.after = after

    def describe(self):
        when = f"+{self.delay:.1f} s" + (" after the join" if self.after == "join" else
                                         " after the rank processes started")
        if self.kind == "sigstop":
            return f"SIGSTOP rank {self.rank} {self.seconds:g} s at {when}"
        if self.kind == "sigkill":
            return f"SIGKILL rank {self.rank} at {when}"
        return "no fault"


def _inject(execution, proc, token, program, plan, hmc_pid_file):
    """Runs on a thread beside the execution: waits for the rank processes, then the delay,
    then signals the rank. Records what it did in execution.fault."""
    fault = {"kind": plan.kind, "rank": plan.rank, "delivered": False, "why": ""}
    execution.fault = fault
    seen = None
    until = time.monotonic() + 60
    while time.monotonic() < until and proc.poll() is None:
        pids = {}
        if hmc_pid_file:
            try:
                with open(hmc_pid_file) as fh:
                    pids = {r: int(p) for r, p in enumerate(fh.read().split())}
            except (OSError, ValueError):
                pids = {}
        else:
            pids = rank_pids(token, program)
        if plan.rank in pids:
            seen = pids[plan.rank]
            break
        time.sleep(0.05)
    if seen is None:
        fault["why"] = "the rank process was never seen"
        return
    if plan.after == "join":
        while execution.joined_at is None and proc.poll() is None and time.monotonic() < until:
            time.sleep(0.02)
        if execution.joined_at is None:
            fault["why"] = "the world's join line never came"
            return
    time.sleep(plan.delay)
    fault["joined"] = execution.joined_at is not None
    fault["pid"] = seen
    fault["at"] = time.monotonic()
    try:
        with open(os.path.join(execution.folder, f"{execution.name}.out"), errors="replace") as fh:
            fault["after_report"] = bool(VERDICT.search(fh.read()))
    except OSError:
        fault["after_report"] = False
    if proc.poll() is not None or _state(seen) in (None, "Z"):
        fault["why"] = "the rank process had ended before the fault"
        return
    try:
        if plan.kind == "sigkill":
            os.kill(seen, signal.SIGKILL)
            fault["delivered"] = True
        elif plan.kind == "sigstop":
            os.kill(seen, signal.SIGSTOP)
            fault["delivered"] = True
            time.sleep(plan.seconds)
            try:
                os.kill(seen, signal.SIGCONT)
            except ProcessLookupError:
                pass
    except ProcessLookupError:
        fault["why"] = "the rank process had ended before the fault"
        fault["delivered"] = False


def run(execution, command, env, token, fault=None, program=None, hmc_pid_file=None,
        document_path=None, inject=None, cwd=None):
    """Runs `command` to its end (bounded by HARD_LIMIT_S), with the fault beside it (a
    FaultPlan, or `inject(execution, proc)` on a thread of its own: the hosts mode's); reads
    the document at document_path; then looks for what it left behind."""
    execution.command = command
    tmp = env["TMPDIR"]
    os.makedirs(tmp, exist_ok=True)
    env = dict(env, CHAOS_MARK=token)
    out_path = os.path.join(execution.folder, f"{execution.name}.out")
    with open(out_path, "w") as out:
        execution.start = time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=cwd or execution.folder)
        stop_watch = threading.Event()
        watcher = threading.Thread(target=_watch_join, daemon=True,
                                   args=(execution, out_path, stop_watch))
        watcher.start()
        injector = None
        if inject is not None:
            injector = threading.Thread(target=inject, daemon=True, args=(execution, proc))
            injector.start()
        elif fault is not None and fault.kind != "none":
            injector = threading.Thread(target=_inject, daemon=True,
                                        args=(execution, proc, token, program, fault,
                                              hmc_pid_file))
            injector.start()
        try:
            execution.code = proc.wait(timeout=HARD_LIMIT_S)
        except subprocess.TimeoutExpired:
            execution.killed_by_harness = True
            _kill_marked(token, proc)
            execution.code = proc.wait()
        execution.end = time.monotonic()
        stop_watch.set()
        watcher.join(timeout=5)
        if injector is not None:
            injector.join(timeout=30)
    with open(out_path, errors="replace") as fh:
        execution.output = fh.read()
    if document_path:
        try:
            with open(document_path) as fh:
                execution.document = json.load(fh)
        except (OSError, ValueError) as error:
            execution.document_error = str(error)
    _leftovers(execution, token, tmp)
    return execution


def _watch_join(execution, out_path, stop):
    """Sets execution.joined_at when the output first shows the world's join line, and
    execution.verdict_at when it first shows a verdict line (the hosts mode times the report
    from the fault to this arrival)."""
    while not stop.is_set():
        try:
            with open(out_path, errors="replace") as fh:
                text = fh.read()
            now = time.monotonic()
            if execution.joined_at is None and JOINED.search(text):
                execution.joined_at = now
            if execution.verdict_at is None and VERDICT.search(text):
                execution.verdict_at = now
                return
        except OSError:
            pass
        stop.wait(0.02)


def _kill_marked(token, proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        pass
    for pid in marked(token):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _leftovers(execution, token, tmp):
    """Processes still alive 3 s after the execution's end, and files in its TMPDIR; both
    are then removed, so that one wrong run does not spill into the next."""
    until = time.monotonic() + 3
    left = marked(token)
    while left and time.monotonic() < until:
        time.sleep(0.1)
        left = marked(token)
    execution.leftover_processes = [f"{pid} {_cmdline(pid)[:120]}" for pid in sorted(left)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if os.path.isdir(tmp):
        execution.leftover_files = sorted(os.listdir(tmp))
        subprocess.run(["rm", "-rf", "--one-file-system", tmp], check=False)


def base_env(folder, name, timeout):
    env = {k: v for k, v in os.environ.items()
           if not re.match(r"^(HMC_|OMPI_|PMIX_|SLURM_|RANK$|WORLD_SIZE$|LOCAL_RANK$|MASTER_)", k)}
    env["TMPDIR"] = os.path.join(folder, f"{name}.tmp")
    env["HMC_JOIN_TIMEOUT"] = "30"
    return env


def hmc_run(tools, folder, name, plan_path, transport, token, fault=None, record=None):
    """hmc-run PLAN --report R (thread ranks, or local rank processes over tcp/store)."""
    execution = Execution(name, folder)
    report = os.path.join(folder, f"{name}.report.json")
    command = [tools.hmc_run, plan_path, "--report", report, "--transport", transport,
               "--join-timeout", "30"]
    if record:
        command += ["--record", record]
    env = base_env(folder, name, None)
    pid_file = None
    if transport != "threads":
        pid_file = os.path.join(folder, f"{name}.pids")
        env["HMC_LAUNCH_PID_FILE"] = pid_file
    return run(execution, command, env, token, fault, tools.hmc_run, pid_file, report)


def driver(tools, folder, name, plan_path, world, timeout, launcher, transport, token,
           fault=None, record=None):
    """The plan driver under mpirun or torchrun, with HMC_REPORT (hmc-world-end/1),
    HMC_TIMEOUT, HMC_TRANSPORT and HMC_RECORD."""
    execution = Execution(name, folder)
    report = os.path.join(folder, f"{name}.end.json")
    env = base_env(folder, name, timeout)
    env.update({"HMC_REPORT": report, "HMC_TIMEOUT": str(timeout), "HMC_TRANSPORT": transport})
    if record:
        env["HMC_RECORD"] = record
    if launcher == "mpirun":
        command = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world)]
        for key in ("HMC_REPORT", "HMC_TIMEOUT", "HMC_TRANSPORT", "HMC_RECORD",
                    "HMC_JOIN_TIMEOUT", "TMPDIR", "CHAOS_MARK"):
            command += ["-x", key]
        command += [tools.driver, plan_path]
    else:
        command = [tools.torchrun, "--standalone", "--nproc_per_node", str(world),
                   "--no_python", tools.driver, plan_path]
    return run(execution, command, env, token, fault, tools.driver, None, report)


def oracle(tools, folder, name, plan_path, token):
    """The reference runner (../shared/oracle/run_oracle.py)."""
    execution = Execution(name, folder)
    report = os.path.join(folder, f"{name}.report.json")
    command = ["/usr/bin/python3", tools.oracle, plan_path, "--report", report]
    return run(execution, command, base_env(folder, name, None), token, None, None, None, report)


def merge(tools, folder, record_dir, token):
    """hmc-run record merge DIR -o M.json: (path or None, the execution)."""
    execution = Execution("merge", folder)
    merged = os.path.join(folder, "replay.json")
    run(execution, [tools.hmc_run, "record", "merge", record_dir, "-o", merged],
        base_env(folder, "merge", None), token)
    return (merged if execution.code == 0 and os.path.exists(merged) else None), execution
