"""The chaos campaign's `hosts` mode (scripts/chaos --modes hosts, docs/chaos.md): one plan of 6
ranks run under mpirun across 3 network-namespace hosts of a cluster box
(tests/cluster/cluster_box.py: h1..h3, 198.18.0.0/24, no route out), 2 ranks each, as hmc-run
or as the plan driver (a program on hmc::joinWorld), with a fault from outside at a random
moment on a host other than rank 0's (h1):

  partition   the host's cable cut at the box's switch, back after 1-10 s
  lost_node   every process of the host killed at once (its kernel stays: FIN/RST reach the
              others), orted and both ranks
  sigstop     one rank of the host stopped (SIGSTOP) for 1-8 s, then SIGCONT
  none

Every run has a box of its own (prefix hcPID-N), removed after the run whatever happened,
also on Ctrl-C or SIGTERM (a harness killed with SIGKILL leaves it: `scripts/cluster down
--prefix hcPID-N` removes it)."""

import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cluster"))
import cluster_box  # noqa: E402
import execute  # noqa: E402

HOSTS = {"h1": 2, "h2": 2, "h3": 2}
WORLD = sum(HOSTS.values())
MASTER_PORT = 29510  # each run's box is fresh: its hosts' ports are all free
PYTHON = "/usr/bin/python3"
BOX_PY = os.path.join(os.path.dirname(HERE), "cluster", "cluster_box.py")
FAULTS = ["none", "partition", "lost_node", "sigstop"]
LAUNCH_VARS = ("HMC_", "OMPI_", "PMIX_", "PMI_", "SLURM_", "TORCHELASTIC_")


def unavailable():
    """Why the box cannot be made here ('' when it can)."""
    try:
        cluster_box.check_available()
    except cluster_box.Unavailable as error:
        return str(error)
    return ""


class Box:
    """`with Box(prefix) as box:` a 3-host cluster box, removed on leaving (an exception,
    Ctrl-C, or SIGTERM, which the harness turns into KeyboardInterrupt while a box is up)."""

    def __init__(self, prefix):
        self.box = cluster_box.ClusterBox(len(HOSTS), prefix)
        self.prefix = prefix
        self.previous = None
        self.removed = None
        self.left = None

    def __enter__(self):
        self.previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _interrupt)
        self.box.up()
        return self.box

    def __exit__(self, *exc):
        try:
            self.removed = cluster_box.down(self.prefix)
            self.left = cluster_box.leftovers(self.prefix)
        finally:
            signal.signal(signal.SIGTERM, self.previous or signal.SIG_DFL)
        return False


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def rank_hosts(box, token, program):
    """rank -> (pid, host name) of the rank processes marked `token` running `program`."""
    inodes = {}
    for host in box.hosts:
        try:
            inodes[os.stat(f"/run/netns/{host.netns}").st_ino] = host.name
        except OSError:
            pass
    out = {}
    for rank, pid in execute.rank_pids(token, program).items():
        try:
            out[rank] = (pid, inodes.get(os.stat(f"/proc/{pid}/ns/net").st_ino, "?"))
        except OSError:
            continue
    return out


def launch_command(box, tools, program, plan_path, transport, timeout, report, record, token):
    """mpirun on h1 across the box's hosts (orted through the box's rsh), running hmc-run
    (--master-addr h1) or the plan driver (HMC_MASTER_ADDR=h1, HMC_REPORT, ...)."""
    agent = f"{PYTHON} {BOX_PY} --prefix {box.prefix} rsh"
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe",
            "--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1",
            "--host", ",".join(f"{h}:{n}" for h, n in HOSTS.items()), "-np", str(WORLD)]
    env = {"CHAOS_MARK": token, "HMC_JOIN_TIMEOUT": "60"}
    if program == "hmc-run":
        argv += [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
        argv += [tools.hmc_run, plan_path, "--report", report, "--transport", transport,
                 "--master-addr", "h1", "--master-port", str(MASTER_PORT),
                 "--join-timeout", "60"]
    else:
        env.update({"HMC_MASTER_ADDR": "h1", "HMC_MASTER_PORT": str(MASTER_PORT),
                    "HMC_REPORT": report, "HMC_TIMEOUT": str(timeout),
                    "HMC_TRANSPORT": transport})
        if record:
            env["HMC_RECORD"] = record
        argv += [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
        argv += [tools.driver, plan_path]
    return argv


def clean_env(host):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(LAUNCH_VARS) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                          "MASTER_ADDR", "MASTER_PORT")}
    return host.env(base=env)


class HostFault:
    """The fault of one host run: kind, the host (h2 or h3), the rank for sigstop (one of
    that host's), how long a partition or stop lasts, and the delay after the world's join
    (the driver's join line; hmc-run: every rank process seen, plus `settle`)."""

    def __init__(self, kind, host, rank_pick, seconds, delay, settle):
        self.kind, self.host, self.rank_pick = kind, host, rank_pick
        self.seconds, self.delay, self.settle = seconds, delay, settle

    def describe(self):
        if self.kind == "partition":
            return f"partition of {self.host} for {self.seconds:g} s at +{self.delay:.1f} s"
        if self.kind == "lost_node":
            return f"every process of {self.host} killed at +{self.delay:.1f} s"
        if self.kind == "sigstop":
            return f"SIGSTOP of a rank of {self.host} for {self.seconds:g} s at +{self.delay:.1f} s"
        return "no fault"


def injector(box, token, program, plan):
    """The fault beside the execution: fills execution.fault with kind, host, ranks (the
    ranks it touched), at, delivered, after_report, why."""

    def inject(execution, proc):
        fault = {"kind": plan.kind, "host": plan.host, "ranks": [], "delivered": False,
                 "why": "", "seconds": plan.seconds}
        execution.fault = fault
        until = time.monotonic() + 90
        ranks = {}
        while time.monotonic() < until and proc.poll() is None:
            ranks = rank_hosts(box, token, program)
            if len(ranks) == WORLD:
                break
            time.sleep(0.05)
        execution.rank_hosts = {r: h for r, (_, h) in ranks.items()}
        if len(ranks) < WORLD:
            fault["why"] = f"only ranks {sorted(ranks)} of {WORLD} were seen"
            return
        if plan.kind == "none":
            return
        if program == "driver":
            while execution.joined_at is None and proc.poll() is None and \
                    time.monotonic() < until:
                time.sleep(0.02)
            if execution.joined_at is None:
                fault["why"] = "the world's join line never came"
                return
        else:
            time.sleep(plan.settle)
        time.sleep(plan.delay)
        on_host = sorted(r for r, (_, h) in ranks.items() if h == plan.host)
        host = box.host(plan.host)
        fault["at"] = time.monotonic()
        fault["after_report"] = execution.verdict_at is not None
        # Whether the world had formed (rank 0's join line): before it, the ranks wait out a
        # partition or a stop in the join (--join-timeout), not in a collective's deadline.
        fault["joined"] = execution.joined_at is not None
        if proc.poll() is not None:
            fault["why"] = "the job had ended before the fault"
            return
        if plan.kind == "partition":
            host.link_down()
            fault["delivered"], fault["ranks"] = True, on_host
            try:
                while time.monotonic() < fault["at"] + plan.seconds:
                    time.sleep(0.02)
            finally:
                host.link_up()
                fault["healed_at"] = time.monotonic()
        elif plan.kind == "lost_node":
            fault["processes"] = host.power_cut()
            fault["delivered"], fault["ranks"] = True, on_host
        elif plan.kind == "sigstop":
            rank = on_host[min(len(on_host) - 1, int(plan.rank_pick * len(on_host)))]
            pid = ranks[rank][0]
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                fault["why"] = "the rank process had ended before the fault"
                return
            fault["delivered"], fault["ranks"] = True, [rank]
            time.sleep(plan.seconds)
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    return inject


def box_leftovers(box, bound_s=3.0):
    """Processes still in the box's hosts (but their holders) `bound_s` after the job, as
    'host:pid:comm'; they are then killed by the box's removal."""
    until = time.monotonic() + bound_s
    while True:
        left = [f"{h.name}:{p}:{execute._cmdline(p)[:80]}" for h in box.hosts for p in h.pids()
                if execute._state(p) not in (None, "Z")]
        if not left or time.monotonic() > until:
            return left
        time.sleep(0.1)


def host_files(box, skip=()):
    """host -> files left in that host's TMPDIR (but hosts in `skip`)."""
    out = {}
    for host in box.hosts:
        if host.name in skip or not os.path.isdir(host.tmpdir):
            continue
        names = sorted(os.listdir(host.tmpdir))
        if names:
            out[host.name] = names
    return out


def run(tools, folder, name, box, program, plan_path, transport, timeout, token, plan,
        record=None):
    """One execution across the box: mpirun on h1, the fault beside it. Returns the
    Execution, with .fault, .rank_hosts, .box_left (processes), .host_files."""
    execution = execute.Execution(name, folder)
    execution.rank_hosts = {}
    report = os.path.join(folder, f"{name}.report.json" if program == "hmc-run"
                          else f"{name}.end.json")
    argv = launch_command(box, tools, program, plan_path, transport, timeout, report, record,
                          token)
    h1 = box.host("h1")
    command = h1.cmd(argv, cwd=folder)
    env = dict(clean_env(h1), CHAOS_MARK=token)
    # hmc-run's front execs hmc-run-torch beside it (app/front.cpp): the rank processes'.
    exe = os.path.join(os.path.dirname(tools.hmc_run), "hmc-run-torch") \
        if program == "hmc-run" else tools.driver
    execute.run(execution, command, env, token, document_path=report,
                inject=injector(box, token, exe, plan), program=exe)
    execution.box_left = box_leftovers(box)
    lost = {plan.host} if plan.kind == "lost_node" and execution.fault and \
        execution.fault.get("delivered") else set()
    execution.host_files = host_files(box, skip=lost)
    execution.lost_host_files = host_files(box) if lost else {}
    return execution


def describe_ranks(execution):
    return ", ".join(f"{r}:{h}" for r, h in sorted(execution.rank_hosts.items()))


def merge_and_replay(tools, folder, record, token):
    merged, _ = execute.merge(tools, folder, record, token + "-m")
    if not merged:
        return None
    return execute.hmc_run(tools, folder, "replay", merged, "threads", token + "-r")
