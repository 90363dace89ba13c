#!/usr/bin/python3
"""A cluster in a box: N test hosts on this machine, each its own network stack and hostname.

Each host is a holder process (`unshare --mount --uts --net`) whose namespaces every command of
that host enters (`nsenter -t HOLDER --mount --uts --net`):
  - its network namespace, named PREFIX-hK (`ip netns attach`), has `lo` and `eth0` with
    198.18.0.(10+K)/24 and no other route: 198.18.0.0/15 is the range reserved for network
    tests (RFC 2544), and nothing reaches beyond the box;
  - its UTS namespace has the hostname hK;
  - its mount namespace has /etc/hosts bound to the box's own (h1..hN and localhost), so the
    hosts find each other by name and a rank's `hostname` names its host.
The hosts' eth0 ends meet in a bridge inside a namespace of its own (PREFIX-sw): the box adds
no interface, address or route to this machine's own network stack. `link_down(host)` and
`link_up(host)` cut and restore a host's cable at the switch; `power_cut(host)` kills every
process of that host at once (its holder stays, so the host can come back); `power_off(host)`
cuts its cable first, so that no FIN or RST of its dying sockets reaches the others, as when a
machine loses power (its peers learn of it only by a deadline). Each host has a folder of its
own for temporary files, `host.tmpdir` (its TMPDIR in `host.env()` and under `rsh`), as the
local /tmp of separate machines: processes that take the hostname for "this machine" (hmc's
evidence folder) find their own files only.

`rsh HOST WORDS...` is a remote shell (as ssh: the words joined are one command line for `sh -c`,
in a clean environment) for launchers that start their daemons through one, e.g. Open MPI:
`mpirun --mca plm_rsh_agent "/usr/bin/python3 .../cluster_box.py --prefix P rsh" --host h1,h2`.

Everything the box makes is named by its prefix (namespaces PREFIX-*, folder
/tmp/PREFIX.box/, processes in those namespaces): `down(prefix)` removes all of it, also after
an interrupted run, and `leftovers(prefix)` says what is still there.

As a command (scripts/cluster): up, exec, down, status, leftovers; see --help.
Python 3 standard library only; needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN).
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

DEFAULT_PREFIX = "hmcbox"
SUBNET = "198.18.0"  # /24 inside 198.18.0.0/15
READY_BOUND_S = 10.0


class Unavailable(Exception):
    """This machine cannot make the box (no root, no namespaces): a reason to skip."""


def _run(argv, check=True, timeout=30, **kw):
    proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError("cluster box: `{}` failed with exit {}: {}".format(
            " ".join(argv), proc.returncode, proc.stderr.strip()))
    return proc


def box_dir(prefix):
    return "/tmp/{}.box".format(prefix)


def netns_names(prefix):
    """Network namespaces of this prefix that exist now."""
    try:
        names = os.listdir("/run/netns")
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix + "-"))


def _netns_inode(path):
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in_netns(name):
    """Pids of the processes whose network namespace is /run/netns/NAME (none for a gone one)."""
    inode = _netns_inode("/run/netns/" + name)
    if inode is None:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat("/proc/{}/ns/net".format(entry)).st_ino == inode:
                pids.append(int(entry))
        except OSError:
            continue  # gone meanwhile, or a kernel thread
    return pids


def _kill_and_reap(pids, bound_s=5.0):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + bound_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if os.path.exists("/proc/{}".format(p))
                 and _state(p) not in ("Z", "X")]
        if alive:
            time.sleep(0.02)
    return alive


def _link_up(where, dev):
    out = _run(["ip"] + where + ["-o", "link", "show", "dev", dev]).stdout
    return "LOWER_UP" in out and ",UP" in out


def _state(pid):
    try:
        with open("/proc/{}/stat".format(pid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


class Host:
    def __init__(self, box, index):
        self.box = box
        self.index = index
        self.name = "h{}".format(index)
        self.addr = "{}.{}".format(SUBNET, 10 + index)
        self.netns = "{}-{}".format(box.prefix, self.name)
        self.port = "v{}".format(index)  # its cable's end at the switch
        self.holder = None  # subprocess.Popen of the holder
        self.holder_pid = None
        self.tmpdir = os.path.join(box.dir, self.name + ".tmp")  # this host's own TMPDIR

    def env(self, extra=None, base=None):
        """An environment for a command on this host: `base` (default: this process's), with
        this host's TMPDIR, and `extra`."""
        env = dict(os.environ if base is None else base)
        env["TMPDIR"] = self.tmpdir
        env.update(extra or {})
        return env

    def cmd(self, argv, cwd=None):
        """argv run on this host: in its network, hostname and /etc/hosts, in `cwd` (default:
        the caller's working directory; entering a mount namespace would start it in /)."""
        return ["nsenter", "-t", str(self.holder_pid), "--mount", "--uts", "--net",
                "--wd=" + (cwd or os.getcwd()), "--"] + list(argv)

    def popen(self, argv, **kw):
        return subprocess.Popen(self.cmd(argv), **kw)

    def run(self, argv, **kw):
        kw.setdefault("stdout", subprocess.PIPE)
        kw.setdefault("stderr", subprocess.PIPE)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(self.cmd(argv), **kw)

    def pids(self):
        """Every process of this host but its holder."""
        return [p for p in pids_in_netns(self.netns) if p != self.holder_pid]

    def link_down(self):
        _run(["ip", "-n", self.box.switch, "link", "set", self.port, "down"])

    def link_up(self):
        _run(["ip", "-n", self.box.switch, "link", "set", self.port, "up"])

    def link_is_up(self):
        return _link_up(["-n", self.box.switch], self.port)

    def power_cut(self):
        """Every process of this host killed at once (SIGKILL); returns how many. The host's
        kernel stays: its sockets close with FIN/RST to their peers (see power_off)."""
        victims = self.pids()
        _kill_and_reap(victims)
        return len(victims)

    def power_off(self):
        """A machine losing power: its cable is cut first, then every process of it is killed,
        so its peers see nothing (no FIN, no RST), only silence. link_up() brings the (empty)
        host back; until then its peers' packets to it are lost. Returns how many processes."""
        self.link_down()
        return self.power_cut()


class ClusterBox:
    """`with ClusterBox(3) as box:` makes hosts box.hosts[0..2] (h1..h3) and removes them."""

    def __init__(self, hosts=3, prefix=DEFAULT_PREFIX):
        if not 1 <= hosts <= 200:
            raise ValueError("cluster box: hosts must be 1..200, not {}".format(hosts))
        self.prefix = prefix
        self.dir = box_dir(prefix)
        self.switch = "{}-sw".format(prefix)
        self.hosts = [Host(self, i) for i in range(1, hosts + 1)]
        self.setup_s = None

    def host(self, name):
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError("cluster box: no host {} (hosts: {})".format(
            name, ", ".join(h.name for h in self.hosts)))

    def __enter__(self):
        self.up()
        return self

    def __exit__(self, *exc):
        self.down()
        return False

    def up(self):
        check_available()
        if netns_names(self.prefix) or os.path.exists(self.dir):
            raise RuntimeError(
                "cluster box: '{}' already exists (namespaces {}, folder {}): another box runs, "
                "or an earlier run was interrupted; `scripts/cluster down --prefix {}` removes it"
                .format(self.prefix, netns_names(self.prefix) or "none", self.dir, self.prefix))
        start = time.monotonic()
        os.makedirs(self.dir)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        self.setup_s = time.monotonic() - start
        with open(os.path.join(self.dir, "state.json"), "w") as f:
            json.dump(self.state(), f, indent=2)

    def _make(self):
        hosts_file = os.path.join(self.dir, "hosts")
        with open(hosts_file, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for h in self.hosts:
                f.write("{} {}\n".format(h.addr, h.name))
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "set", "lo", "up"])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for h in self.hosts:
            ready = os.path.join(self.dir, h.name + ".ready")
            script = ("hostname {name} && mount --bind {hosts} /etc/hosts && : > {ready} "
                      "&& exec sleep infinity").format(name=h.name, hosts=hosts_file, ready=ready)
            h.holder = subprocess.Popen(
                ["unshare", "--mount", "--uts", "--net", "--propagation", "private",
                 "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                start_new_session=True)
            h.holder_pid = h.holder.pid
            os.makedirs(h.tmpdir, mode=0o1777, exist_ok=True)
            os.chmod(h.tmpdir, 0o1777)
            deadline = time.monotonic() + READY_BOUND_S
            while not os.path.exists(ready):
                if h.holder.poll() is not None:
                    raise RuntimeError("cluster box: host {}'s holder exited {}: {}".format(
                        h.name, h.holder.returncode, h.holder.stderr.read().strip()))
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster box: host {} not set up within {:.0f} s".format(
                        h.name, READY_BOUND_S))
                time.sleep(0.01)
            _run(["ip", "netns", "attach", h.netns, str(h.holder_pid)])
            _run(["ip", "-n", self.switch, "link", "add", h.port, "type", "veth",
                  "peer", "name", "eth0", "netns", h.netns])
            _run(["ip", "-n", self.switch, "link", "set", h.port, "master", "br0"])
            _run(["ip", "-n", self.switch, "link", "set", h.port, "up"])
            _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
            _run(["ip", "-n", h.netns, "addr", "add", h.addr + "/24", "dev", "eth0"])
            _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
        # Ready when every cable is up at both ends and the switch forwards on every port (no
        # STP: a bridge port forwards once its link is up).
        deadline = time.monotonic() + READY_BOUND_S
        for h in self.hosts:
            while not (_link_up(["-n", h.netns], "eth0") and _link_up(["-n", self.switch], h.port)
                       and "state forwarding" in _run(["bridge", "-n", self.switch, "link", "show",
                                                       "dev", h.port]).stdout):
                if time.monotonic() > deadline:
                    raise RuntimeError("cluster box: {}'s link is not up within {:.0f} s".format(
                        h.name, READY_BOUND_S))
                time.sleep(0.02)

    def state(self):
        return {"prefix": self.prefix, "dir": self.dir, "switch": self.switch,
                "hosts": [{"name": h.name, "addr": h.addr, "netns": h.netns,
                           "holder_pid": h.holder_pid} for h in self.hosts]}

    def down(self):
        return down(self.prefix)


def down(prefix):
    """Removes every process, namespace and folder of this prefix; returns what it removed."""
    removed = {"processes": 0, "namespaces": [], "dir": None}
    names = netns_names(prefix)
    for name in names:
        pids = pids_in_netns(name)
        left = _kill_and_reap(pids)
        removed["processes"] += len(pids) - len(left)
    for name in names:
        _run(["ip", "netns", "del", name], check=False)
        removed["namespaces"].append(name)
    d = box_dir(prefix)
    if os.path.exists(d):
        # Anything still mounted from the folder (a host's /etc/hosts) went with its namespace.
        shutil.rmtree(d, ignore_errors=True)
        removed["dir"] = d
    return removed


def leftovers(prefix):
    """What of this prefix is still here: namespaces, processes in them, the folder."""
    names = netns_names(prefix)
    return {"namespaces": names,
            "processes": sorted(p for n in names for p in pids_in_netns(n)),
            "dir": box_dir(prefix) if os.path.exists(box_dir(prefix)) else None}


# The niceness the cluster tests run at (raise_priority).
TEST_NICENESS = -10


def raise_priority(niceness=TEST_NICENESS):
    """Runs this process, and every process it starts from now on (launchers, daemons, ranks),
    at `niceness`. The cluster tests time a fault to every rank's exit within the deadline plus
    2 s: at a higher priority than the other tests CTest runs beside them (and than a busy loop
    of anyone's), their CPU load does not enter those timings, and CTest can run them beside
    other tests. Returns what it did, for the log; a process that may not raise its priority
    goes on at its own, and says so."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if before <= niceness:
        return "running at niceness {}".format(before)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    except OSError as e:
        return ("running at niceness {} (could not set {}: {}): other load on this machine "
                "can delay the timed checks".format(before, niceness, e.strerror))
    return "running at niceness {} (was {}), as every process this test starts".format(
        niceness, before)


def check_available():
    """Raises Unavailable, with the reason, where the box cannot be made here."""
    if os.geteuid() != 0:
        raise Unavailable("the cluster box needs root (network and mount namespaces)")
    for tool in ("ip", "bridge", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            raise Unavailable("the cluster box needs `{}` (Debian: iproute2, util-linux)".format(tool))
    probe = _run(["unshare", "--mount", "--uts", "--net", "true"], check=False)
    if probe.returncode != 0:
        raise Unavailable("cannot create namespaces here (`unshare --mount --uts --net true`: "
                          "{})".format(probe.stderr.strip()))
    # The switch and the cables: a bridge and a veth pair, tried in a network namespace of
    # their own (gone with the command), where a kernel without those drivers says so.
    probe = _run(["unshare", "--net", "sh", "-c",
                  "ip link add hmcprobe0 type bridge && "
                  "ip link add hmcprobe1 type veth peer name hmcprobe2"], check=False)
    if probe.returncode != 0:
        raise Unavailable("cannot make a bridge and a veth pair in a network namespace here "
                          "(`ip link add ... type bridge|veth`: {}); the kernel needs the "
                          "bridge and veth drivers".format(probe.stderr.strip()))


def load(prefix):
    """The box of a prefix that `scripts/cluster up` left running."""
    path = os.path.join(box_dir(prefix), "state.json")
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise RuntimeError("cluster box: no box '{}' is up (no {}); `scripts/cluster up` "
                           "makes one".format(prefix, path)) from None
    box = ClusterBox(len(state["hosts"]), prefix)
    for h, s in zip(box.hosts, state["hosts"]):
        h.holder_pid = s["holder_pid"]
    return box


# A clean environment for rsh, as ssh gives a remote command (no variable of the caller leaks).
RSH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def rsh(prefix, words):
    """ssh's contract: `rsh [-opts] HOST WORD...` runs the words, joined by spaces, as one
    `sh -c` command line on HOST in a clean environment (HOME, PATH, USER, SHELL, and the host's
    TMPDIR); its exit status is the command's. Options before the host (ssh's -x, -q ...) are
    accepted and ignored."""
    words = list(words)
    while words and words[0].startswith("-"):
        words.pop(0)
    if len(words) < 2:
        print("# cluster_box rsh: usage: rsh HOST COMMAND...", file=sys.stderr)
        return 2
    host = load(prefix).host(words[0])
    env = {"HOME": os.environ.get("HOME", "/root"), "PATH": RSH_PATH, "SHELL": "/bin/sh",
           "USER": os.environ.get("USER", "root"), "LOGNAME": os.environ.get("USER", "root"),
           "TMPDIR": host.tmpdir}
    argv = host.cmd(["/bin/sh", "-c", " ".join(words[1:])], cwd=env["HOME"])  # as ssh: $HOME
    sys.stdout.flush()
    os.execvpe(argv[0], argv, env)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="scripts/cluster",
        description="A cluster in a box: test hosts h1..hN in network namespaces on this "
                    "machine (198.18.0.0/24, no route out), for hmc-run across hosts.")
    parser.add_argument("--prefix", default=DEFAULT_PREFIX,
                        help="names of this box's namespaces and folder (default: %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)
    up_p = sub.add_parser("up", help="make the hosts and leave them up")
    up_p.add_argument("--hosts", type=int, default=3, help="how many (default: %(default)s)")
    ex = sub.add_parser("exec", help="run a command on a host: exec h2 -- hostname")
    ex.add_argument("host")
    ex.add_argument("argv", nargs=argparse.REMAINDER)
    rs = sub.add_parser("rsh", help="a remote shell for launchers (mpirun's plm_rsh_agent): "
                                    "rsh HOST WORDS... runs the words as `sh -c` on HOST, as ssh")
    rs.add_argument("words", nargs=argparse.REMAINDER)
    sub.add_parser("down", help="remove the box (also what an interrupted run left)")
    sub.add_parser("status", help="the hosts, their addresses and processes (JSON)")
    sub.add_parser("leftovers", help="what of the box is still here (JSON); exit 1 if any")
    argv = sys.argv[1:] if argv is None else list(argv)
    words = None
    if "rsh" in argv[:3]:  # rsh takes everything after it as is, options too (ssh's -x ...)
        cut = argv.index("rsh") + 1
        argv, words = argv[:cut], argv[cut:]
    args = parser.parse_args(argv)
    if words is not None:
        args.words = words
    try:
        if args.command == "up":
            box = ClusterBox(args.hosts, args.prefix)
            box.up()
            print(json.dumps(dict(box.state(), setup_s=round(box.setup_s, 3)), indent=2))
        elif args.command == "exec":
            cmd = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
            if not cmd:
                parser.error("exec needs a command: exec h1 -- hostname")
            return subprocess.call(load(args.prefix).host(args.host).cmd(cmd))
        elif args.command == "rsh":
            return rsh(args.prefix, args.words)
        elif args.command == "down":
            print(json.dumps(down(args.prefix)))
        elif args.command == "status":
            box = load(args.prefix)
            print(json.dumps(dict(box.state(), processes={
                h.name: h.pids() for h in box.hosts}), indent=2))
        elif args.command == "leftovers":
            left = leftovers(args.prefix)
            print(json.dumps(left))
            return 1 if any(left.values()) else 0
    except Unavailable as e:
        print("# scripts/cluster: {}".format(e), file=sys.stderr)
        return 77
    except (RuntimeError, KeyError) as e:
        print("# scripts/cluster: {}".format(e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
