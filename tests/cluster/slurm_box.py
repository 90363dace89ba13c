#!/usr/bin/python3
"""A real Slurm (Debian's slurm-wlm and munge) on the hosts of a cluster box (cluster_box.py).

    with ClusterBox(4, prefix="hmcsl") as box, SlurmBox(box, controller="h4",
                                                         nodes=["h1", "h2", "h3"]) as slurm:
        slurm.run("h4", ["srun", "-N", "3", "hostname"])

Everything lives under the box's folder (/tmp/PREFIX.box/slurm/) and inside the box's hosts:
  - munged on the controller host, with its own key, socket, pid, seed and log files
    (slurm.conf `AuthInfo=socket=...` points every daemon and client at that socket; a
    pathname socket is reached from every host, which all see the same /tmp);
  - slurm.conf of its own, given to every daemon with -f and to every client through
    SLURM_CONF; no cgroups (ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), no
    accounting, no job completion log;
  - slurmctld on the controller host, one slurmd per compute host (`slurmd -N hK`, its own
    spool folder, pid and log file: %n in slurm.conf).
Every daemon runs in the foreground (-D / -F) as a child of this process, entered into its host
with nsenter of the holder's mount, UTS and network namespaces (so /sys stays the machine's).
It stops them at the end (stop(), the context manager, atexit, SIGTERM/SIGHUP); anything left,
also after SIGKILL of this process, is in the box's namespaces, which cluster_box.down(prefix)
empties.

Readiness is observed, bounded: `sinfo` on the controller host shows every node idle.

As a command: `slurm_box.py [--prefix P] [--hosts N] check` makes a box and a Slurm, runs
`srun -N N hostname`, tears everything down and prints the times (JSON). Exit 77 (the reason
printed) where the box cannot be made or slurm-wlm/munge is not installed.
Python 3 standard library only; needs root.
"""

import argparse
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_box  # noqa: E402
from cluster_box import ClusterBox, Unavailable  # noqa: E402

READY_BOUND_S = 60.0
STOP_BOUND_S = 10.0
# Slurm timers, small so that a test sees the scheduler's reactions within seconds.
KILL_WAIT_S = 5          # SIGTERM -> SIGKILL at a job's end (scancel, time limit)
SLURMD_TIMEOUT_S = 10    # a node that does not answer for this long is DOWN

DAEMONS = ("munged", "slurmctld", "slurmd")


def check_available():
    """Raises Unavailable, with the reason, where this machine cannot run the Slurm box."""
    cluster_box.check_available()
    missing = [tool for tool in ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol",
                                 "sinfo", "scancel") if shutil.which(tool) is None]
    if missing:
        raise Unavailable("the Slurm box needs {} (Debian: apt-get install slurm-wlm munge)".format(
            ", ".join(missing)))


def clean_env(extra=None):
    """This process's environment without any launcher's or job's variables."""
    drop = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "OMPI_", "PMI", "TORCHELASTIC_", "HMC_")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(drop) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                   "MASTER_ADDR", "MASTER_PORT")}
    env.update(extra or {})
    return env


class SlurmBox:
    def __init__(self, box, controller="h1", nodes=None, cpus=8, partitions=None):
        """nodes: the compute hosts (default: every host); partitions: {name: [host names]},
        the first one the default (default: {"box": nodes})."""
        self.box = box
        self.controller = box.host(controller)
        self.nodes = [box.host(n) for n in (nodes or [h.name for h in box.hosts])]
        self.partitions = partitions or {"box": [h.name for h in self.nodes]}
        self.cpus = cpus
        self.dir = os.path.join(box.dir, "slurm")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_dir = os.path.join(self.dir, "munge")
        self.socket = os.path.join(self.munge_dir, "munge.socket")
        self.procs = {}  # "munged" / "slurmctld" / "slurmd-hK" -> Popen
        self.setup_s = None
        self.teardown_s = None
        self._logs = []

    # --- set-up ------------------------------------------------------------------------

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    def env(self, extra=None):
        return clean_env(dict({"SLURM_CONF": self.conf}, **(extra or {})))

    def start(self):
        check_available()
        began = time.monotonic()
        _register(self)
        _become_subreaper()
        try:
            os.makedirs(self.munge_dir)
            os.chmod(self.munge_dir, 0o700)
            self._write_conf()
            self._start_munged()
            self._start_daemon("slurmctld", self.controller,
                               ["slurmctld", "-D", "-i", "-f", self.conf])
            self._wait_for(lambda: self._sinfo() is not None, "slurmctld to answer sinfo")
            for h in self.nodes:
                self.start_slurmd(h)
            self.wait_idle()
        except BaseException:
            self.stop()
            raise
        self.setup_s = time.monotonic() - began

    def _write_conf(self):
        d = self.dir
        for sub in ("state", "spool", "log", "out"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        names = ",".join(h.name for h in self.nodes)
        lines = [
            "# slurm.conf of the Slurm box {} (tests/cluster/slurm_box.py)".format(self.box.prefix),
            "ClusterName={}".format(self.box.prefix),
            "SlurmctldHost={}({})".format(self.controller.name, self.controller.addr),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket={}".format(self.socket),
            "StateSaveLocation={}/state".format(d),
            "SlurmdSpoolDir={}/spool/%n".format(d),
            "SlurmctldPidFile={}/slurmctld.pid".format(d),
            "SlurmdPidFile={}/slurmd-%n.pid".format(d),
            "SlurmctldLogFile={}/log/slurmctld.log".format(d),
            "SlurmdLogFile={}/log/slurmd-%n.log".format(d),
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            # The node's CPUs as configured here, not as probed (2 shared cores).
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "SlurmdTimeout={}".format(SLURMD_TIMEOUT_S),
            "SlurmctldTimeout=10",
            "MessageTimeout=5",
            "KillWait={}".format(KILL_WAIT_S),
            "OverTimeLimit=0",
            "InactiveLimit=0",
            "MinJobAge=600",
            "UnkillableStepTimeout=30",
            # A batch job that loses a node fails; it is not queued again (minutes later).
            "JobRequeue=0",
            "NodeName={} CPUs={} State=UNKNOWN".format(names, self.cpus),
        ]
        for i, (part, members) in enumerate(self.partitions.items()):
            lines.append("PartitionName={} Nodes={} Default={} MaxTime=INFINITE State=UP".format(
                part, ",".join(members), "YES" if i == 0 else "NO"))
        # Each node's address: slurm.conf's NodeAddr, or the box's /etc/hosts (every host
        # resolves the others by name).
        with open(self.conf, "w") as f:
            f.write("\n".join(lines) + "\n")

    def _start_munged(self):
        key = os.path.join(self.munge_dir, "munge.key")
        with open(key, "wb") as f:
            os.fchmod(f.fileno(), 0o400)
            f.write(os.urandom(1024))
        self._start_daemon("munged", self.controller, [
            "munged", "--foreground", "--force",
            "--socket={}".format(self.socket),
            "--key-file={}".format(key),
            "--pid-file={}".format(os.path.join(self.munge_dir, "munged.pid")),
            "--seed-file={}".format(os.path.join(self.munge_dir, "munged.seed")),
            "--log-file={}".format(os.path.join(self.munge_dir, "munged.log"))])
        self._wait_for(lambda: os.path.exists(self.socket), "munged's socket")

    def _start_daemon(self, name, host, argv):
        log = open(os.path.join(self.dir, "log", name + ".out"), "w")
        self._logs.append(log)
        self.procs[name] = host.popen(argv, env=self.env(), stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)  # no Ctrl-C of the terminal

    def start_slurmd(self, host):
        """(Re)starts host's slurmd (after a power cut, say)."""
        name = "slurmd-" + host.name
        old = self.procs.get(name)
        if old is not None and old.poll() is None:
            raise RuntimeError("slurm box: {} still runs".format(name))
        os.makedirs(os.path.join(self.dir, "spool", host.name), exist_ok=True)
        self._start_daemon(name, host, ["slurmd", "-D", "-N", host.name, "-f", self.conf])

    def _wait_for(self, ready, what, bound=READY_BOUND_S):
        deadline = time.monotonic() + bound
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None and name in ("munged", "slurmctld"):
                    raise RuntimeError("slurm box: {} exited {} while waiting for {}:\n{}".format(
                        name, proc.returncode, what, self.log_tail(name)))
            if time.monotonic() > deadline:
                raise RuntimeError("slurm box: no {} within {:.0f} s\n{}".format(
                    what, bound, self.log_tail()))
            time.sleep(0.1)

    def _sinfo(self):
        """{node: state} from sinfo on the controller host, or None when it does not answer."""
        try:
            proc = self.run(self.controller, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10)
        except subprocess.TimeoutExpired:
            return None
        if proc.returncode != 0:
            return None
        states = {}
        for line in proc.stdout.split("\n"):
            if line.strip():
                node, state = line.split()
                states[node] = state
        return states

    def node_states(self):
        return self._sinfo() or {}

    def wait_idle(self, nodes=None, bound=READY_BOUND_S):
        """Until sinfo shows each of `nodes` (default: all) idle."""
        want = [h.name if hasattr(h, "name") else h for h in (nodes or self.nodes)]
        last = {}

        def idle():
            last.clear()
            last.update(self._sinfo() or {})
            return all(last.get(n) == "idle" for n in want)
        try:
            self._wait_for(idle, "idle nodes {}".format(",".join(want)), bound)
        except RuntimeError as e:
            raise RuntimeError("{} (sinfo: {})".format(e, last)) from None

    def log_tail(self, name=None, lines=15):
        out = []
        for path in sorted(os.listdir(os.path.join(self.dir, "log"))):
            if name and not path.startswith(name):
                continue
            try:
                with open(os.path.join(self.dir, "log", path), errors="replace") as f:
                    tail = f.read().splitlines()[-lines:]
            except OSError:
                continue
            out.append("--- {}\n{}".format(path, "\n".join(tail)))
        return "\n".join(out)

    # --- use -----------------------------------------------------------------------------

    def popen(self, host, argv, env=None, **kw):
        if isinstance(host, str):
            host = self.box.host(host)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return host.popen(argv, env=self.env(env), **kw)

    def run(self, host, argv, env=None, timeout=60, **kw):
        if isinstance(host, str):
            host = self.box.host(host)
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("stdin", subprocess.DEVNULL)
        return host.run(argv, env=self.env(env), timeout=timeout, text=True, **kw)

    def job(self, job_id):
        """`scontrol show job` as a dict (JobState, ExitCode, StdOut, ...), or None."""
        proc = self.run(self.controller, ["scontrol", "-o", "show", "job", str(job_id)],
                        timeout=15)
        if proc.returncode != 0 or not proc.stdout.strip():
            return None
        fields = {}
        for word in proc.stdout.split():
            if "=" in word:
                k, v = word.split("=", 1)
                fields[k] = v
        return fields

    # --- teardown ------------------------------------------------------------------------

    def stop(self):
        """Every daemon of this Slurm (and every job step process on its hosts) gone."""
        began = time.monotonic()
        procs = dict(self.procs)
        for proc in procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGKILL)  # their state is thrown away anyway
                except ProcessLookupError:
                    pass
        for proc in procs.values():
            try:
                proc.wait(STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                pass
        # slurmstepd and the tasks of a job that was still running: SIGKILL to whatever runs
        # on the hosts but their holders.
        for h in self.box.hosts:
            cluster_box._kill_and_reap(h.pids())
        _reap_orphans()
        for log in self._logs:
            log.close()
        self._logs = []
        self.procs = {}
        _unregister(self)
        self.teardown_s = time.monotonic() - began


# --- teardown on exit and on signals ---------------------------------------------------------

def _become_subreaper():
    """slurmd forks slurmstepd twice over (and slurmctld its slurmscriptd): their parents exit
    and they are reparented to this process instead of to pid 1, so that stop() can reap them.
    (A pid 1 that reaps lazily left them as zombies that `pgrep slurm` still listed.)"""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass


def reap_children():
    """Reaps every child of this process that has ended; call it after cluster_box.down(),
    which kills what is left in the box: else the zombies go to pid 1 when this process exits,
    and `pgrep` lists them until it reaps them."""
    _reap_orphans()


def _reap_orphans():
    """Reaps the children that have ended (the daemons and what was reparented to us: stop()
    killed them and waited until they were zombies). Others (the box's holders) stay."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return



_LIVE = []


def _stop_all():
    for slurm in list(_LIVE):
        try:
            slurm.stop()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


def _on_signal(signum, _frame):
    # Unwinds the with-blocks (their __exit__ stop Slurm and remove the box), as Ctrl-C does.
    raise KeyboardInterrupt("signal {}".format(signum))


def _register(slurm):
    if not _LIVE:
        atexit.register(_stop_all)
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _on_signal)
        # A shell starts a background job with SIGINT ignored, and Python then leaves it so:
        # `kill -INT` of such a run would leave the daemons. Ctrl-C unwinds here in any case.
        if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
            signal.signal(signal.SIGINT, signal.default_int_handler)
    _LIVE.append(slurm)


def _unregister(slurm):
    if slurm in _LIVE:
        _LIVE.remove(slurm)


def main(argv=None):
    parser = argparse.ArgumentParser(description="A Slurm on the hosts of a cluster box: check "
                                                 "that it starts, runs a step, and goes.")
    parser.add_argument("--prefix", default="hmcsl")
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("command", choices=["check"])
    args = parser.parse_args(argv)
    try:
        check_available()
    except Unavailable as e:
        print("# slurm_box: {}".format(e), file=sys.stderr)
        return 77
    began = time.monotonic()
    box = ClusterBox(args.hosts, prefix=args.prefix)
    try:
        box.up()
        slurm = SlurmBox(box)
        slurm.start()
        ready = time.monotonic() - began
        names = ",".join(h.name for h in box.hosts)
        run = slurm.run("h1", ["srun", "-N", str(args.hosts), "-l", "hostname"], timeout=60)
        slurm.stop()
    finally:
        down_began = time.monotonic()
        box.down()
        reap_children()
    print(json.dumps({"box_s": round(box.setup_s, 2), "box_and_slurm_s": round(ready, 2),
                      "slurm_teardown_s": round(slurm.teardown_s, 2),
                      "box_down_s": round(time.monotonic() - down_began, 2),
                      "srun_exit": run.returncode, "srun_out": run.stdout.split("\n"),
                      "srun_err": run.stderr[-2000:], "nodes": names}, indent=2))
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
