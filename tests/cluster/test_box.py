#!/usr/bin/python3
"""The cluster box itself (tests/cluster/cluster_box.py), CTest label `cluster`.

Usage: test_box.py [-k NAME]

- hosts: each has its own hostname and network stack (lo and eth0, one route, 198.18.0.0/24),
  finds the others by name, reaches them, and reaches nothing outside the box;
- link_down cuts a host off (a connect to it fails within its bound) and link_up brings it
  back (a connect succeeds again);
- power_cut kills every process of the host at once, and the host stays usable;
- down removes everything: after a run that ends, after Ctrl-C (the context manager's exit),
  and after a kill -9 of the process that made the box (`down(prefix)` then, as
  `scripts/cluster down` does).

Exit 0 when every case passed, 1 when one failed, 77 when this machine cannot make the box
(the reason printed). Every wait is bounded. Python 3 standard library only.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cluster_box  # noqa: E402

ONLY = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
PREFIX = "hmcbt"
PY = "/usr/bin/python3"

# A TCP client run on a host: connects to HOST:PORT within TIMEOUT; prints "ok" or the errno name.
CONNECT = r"""
import errno, socket, sys
s = socket.socket(); s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); print("ok")
except socket.timeout:
    print("timeout")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
"""
# A TCP server run on a host: listens on PORT, prints "listening", accepts forever.
SERVE = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16); print("listening", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""


def connect(host, target, port, timeout=1.0):
    return host.run([PY, "-c", CONNECT, target, str(port), str(timeout)],
                    timeout=timeout + 30).stdout.strip()


def serve(host, port):
    server = host.popen([PY, "-c", SERVE, str(port)], stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline().strip()  # bounded: the server prints it or exits
    assert line == "listening", f"the server on {host.name} did not start: {line!r}"
    return server


def case_hosts(box):
    h1, h2, h3 = box.hosts
    for h in box.hosts:
        assert h.run(["hostname"]).stdout.strip() == h.name
        links = h.run(["ip", "-o", "link", "show"]).stdout
        names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
        assert names == ["eth0", "lo"], names
        routes = [r.strip() for r in h.run(["ip", "route", "show"]).stdout.strip().splitlines()]
        assert routes == [f"198.18.0.0/24 dev eth0 proto kernel scope link src {h.addr}"], routes
        assert h.run(["getent", "hosts", "h3"]).stdout.split()[0] == h3.addr
    server = serve(h2, 7000)
    try:
        assert connect(h1, "h2", 7000) == "ok"
        assert connect(h3, "h2", 7000) == "ok"
        # Nothing beyond the box: no route, refused at once (no packet leaves).
        assert connect(h1, "198.19.0.1", 80) == "ENETUNREACH"
        assert connect(h1, "192.0.2.1", 80) == "ENETUNREACH"
    finally:
        server.kill()
        server.wait(timeout=10)


def case_link(box):
    h1, h2, _ = box.hosts
    server = serve(h2, 7001)
    try:
        assert connect(h1, "h2", 7001) == "ok"
        h2.link_down()
        result = connect(h1, "h2", 7001, timeout=1.0)
        assert result in ("timeout", "EHOSTUNREACH"), result
        h2.link_up()
        deadline = time.monotonic() + 10
        while connect(h1, "h2", 7001) != "ok":
            assert time.monotonic() < deadline, "h2 not reachable 10 s after its link came up"
    finally:
        server.kill()
        server.wait(timeout=10)


def case_power_cut(box):
    _, h2, _ = box.hosts
    sleepers = [h2.popen(["sleep", "1000"]) for _ in range(3)]
    deadline = time.monotonic() + 10
    while len(h2.pids()) < 3:
        assert time.monotonic() < deadline, f"h2 runs {h2.pids()}"
        time.sleep(0.01)
    assert h2.power_cut() >= 3
    for sleeper in sleepers:
        assert sleeper.wait(timeout=10) != 0
    assert h2.pids() == [], h2.pids()
    assert h2.run(["hostname"]).stdout.strip() == "h2"  # the host itself is still there


def leftovers_of(prefix):
    left = cluster_box.leftovers(prefix)
    return {k: v for k, v in left.items() if v}


def case_down_after_interrupt(_box):
    """A box made by a process that gets Ctrl-C, or kill -9, leaves nothing after down()."""
    here = os.path.dirname(os.path.abspath(__file__))
    maker = ("import sys, time; sys.path.insert(0, {here!r}); import cluster_box\n"
             "with cluster_box.ClusterBox(2, {prefix!r}) as box:\n"
             "    box.hosts[0].popen(['sleep', '1000'])\n"
             "    print('up', flush=True); time.sleep(1000)\n")
    for sig, prefix in ((signal.SIGINT, PREFIX + "-int"), (signal.SIGKILL, PREFIX + "-kill")):
        cluster_box.down(prefix)
        child = subprocess.Popen([PY, "-c", maker.format(here=here, prefix=prefix)],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert child.stdout.readline().strip() == "up"
            assert leftovers_of(prefix), "the box is not up"
            child.send_signal(sig)
            child.wait(timeout=30)
            if sig == signal.SIGKILL:
                assert leftovers_of(prefix), "kill -9 cannot clean up: something must be left"
                cluster_box.down(prefix)
            assert leftovers_of(prefix) == {}, (sig, leftovers_of(prefix))
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            cluster_box.down(prefix)


CASES = [case_hosts, case_link, case_power_cut, case_down_after_interrupt]


def main():
    try:
        cluster_box.check_available()
    except cluster_box.Unavailable as e:
        print(f"# skipped: {e}")
        return 77
    cluster_box.down(PREFIX)  # what an interrupted earlier run left
    passed = failed = 0
    start = time.monotonic()
    box = cluster_box.ClusterBox(3, PREFIX)
    box.up()
    try:
        print(f"# box up: 3 hosts in {box.setup_s:.2f} s")
        for case in CASES:
            if ONLY and ONLY not in case.__name__:
                continue
            t0 = time.monotonic()
            try:
                case(box)
                passed += 1
                print(f"ok   {case.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
            except Exception:
                failed += 1
                print(f"FAIL {case.__name__} ({time.monotonic() - t0:.1f} s)", flush=True)
                traceback.print_exc()
    finally:
        t0 = time.monotonic()
        box.down()
        down_s = time.monotonic() - t0
    left = leftovers_of(PREFIX)
    print(f"# box down in {down_s:.2f} s; left: {left or 'nothing'}")
    if left:
        failed += 1
    print(f"{passed} passed, {failed} failed ({time.monotonic() - start:.1f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
