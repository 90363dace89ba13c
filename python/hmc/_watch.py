"""The rank's watcher: its heartbeat in the job's own store, under hmc's keys (the C++ library's
hmc-heartbeat/1 and hmc-job/1 documents), and the deadline: a rank that waits in an exchange
past HMC_TIMEOUT says so, and the lowest such rank prints `hmc-run status` of the job (who
waits where, who never came). HMC_ON_HANG=abort then ends the rank with exit status 3."""

import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from ._flight import FLIGHT

KEY_PREFIX = "hmc/kv/"
PERIOD_S = 0.1      # a heartbeat at most this often
KEEPALIVE_S = 1.0   # and at least this often
STATUS_TIMEOUT_S = 10


def log(text):
    print(f"# hmc: {text}", file=sys.stderr, flush=True)


def seconds_variable(name, default):
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise SystemExit(f"# hmc: {name}='{text}' is not a number of seconds (for example "
                         f"{name}=30)") from None
    if not 0 < value <= 86400:
        raise SystemExit(f"# hmc: {name}={text} is out of range: give 0 < seconds <= 86400")
    return value


def on_hang():
    choice = os.environ.get("HMC_ON_HANG", "report")
    if choice not in ("report", "abort"):
        raise SystemExit(f"# hmc: HMC_ON_HANG='{choice}': give report (print and wait on) or "
                         "abort (print, then end this rank with exit status 3)")
    return choice


def hmc_run_binary():
    """hmc-run: HMC_RUN, else on PATH, else this repository's build (python/../build/app)."""
    named = os.environ.get("HMC_RUN")
    if named:
        return named
    found = shutil.which("hmc-run")
    if found:
        return found
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.normpath(os.path.join(here, "..", "..", "build", "app", "hmc-run"))
    return built if os.access(built, os.X_OK) else None


class Watcher:
    """Started once the process group exists (the first exchange): the rank, the world, the
    store's address are then known."""

    def __init__(self, rank, world_size, backend):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout_s = seconds_variable("HMC_TIMEOUT", 30.0)
        self.on_hang = on_hang()
        self.addr = os.environ.get("MASTER_ADDR")
        self.port = os.environ.get("MASTER_PORT")
        self.store = None
        self.beat = 0
        self.reported = set()  # sequences already reported past their deadline
        self.stopping = threading.Event()
        self.thread = None

    def start(self):
        if not self.addr or not self.port:
            log(f"rank {self.rank}: MASTER_ADDR/MASTER_PORT are not set: no heartbeats, and "
                "`hmc-run status` cannot attach (the deadline still holds). Launch with torchrun, "
                "or set them as torch.distributed's env:// does")
        else:
            self.store = self._connect()
        if self.store is not None and self.rank == 0:
            meta = {"format": "hmc-job/1", "scenario": os.path.basename(sys.argv[0] or "python"),
                    "world_size": self.world_size, "timeout_s": self.timeout_s,
                    "transport": f"reference/{self.backend}", "started_at": time.time()}
            self._set("meta", meta)
        if self.rank == 0 and self.store is not None:
            log(f"world of {self.world_size} ranks (reference, {self.backend}); store at "
                f"{self.addr}:{self.port} (attach: hmc-run status --master-addr {self.addr} "
                f"--master-port {self.port})")
        self.thread = threading.Thread(target=self._run, name="hmc-watch", daemon=True)
        self.thread.start()

    def _connect(self):
        import torch.distributed as dist
        try:
            return dist.TCPStore(self.addr, int(self.port), is_master=False,
                                 timeout=datetime.timedelta(seconds=30),
                                 wait_for_workers=False)
        except Exception as error:  # noqa: BLE001: any failure is reported, none is fatal
            log(f"rank {self.rank}: cannot connect to the job's store at {self.addr}:"
                f"{self.port} ({error}): no heartbeats, and `hmc-run status` cannot attach")
            return None

    def _set(self, key, document):
        try:
            self.store.set(KEY_PREFIX + key, json.dumps(document))
            return True
        except Exception as error:  # noqa: BLE001: the store went (its host ended)
            log(f"rank {self.rank}: writing '{key}' to the store at {self.addr}:{self.port}: "
                f"{error}; no more heartbeats")
            self.store = None
            return False

    def _run(self):
        last = 0.0
        while not self.stopping.is_set():
            FLIGHT.changed.wait(KEEPALIVE_S)
            wait = PERIOD_S - (time.monotonic() - last)
            if wait > 0:
                time.sleep(wait)
            FLIGHT.changed.clear()
            last = time.monotonic()
            if self.store is not None:
                self._set(f"heartbeat/{self.rank}", FLIGHT.heartbeat(self.rank, self.beat))
                self.beat += 1
            self._check_deadline()

    def _check_deadline(self):
        waiting = FLIGHT.waiting_for()
        if waiting is None:
            return
        entry, seconds = waiting
        if seconds < self.timeout_s or entry["sequence"] in self.reported:
            return
        self.reported.add(entry["sequence"])
        log(f"rank {self.rank} waits in '{entry['stage']}' #{entry['sequence']} for "
            f"{seconds:.1f} s, past the deadline (HMC_TIMEOUT={self.timeout_s:g} s)")
        self._print_status()
        if self.on_hang == "abort":
            log(f"rank {self.rank}: HMC_ON_HANG=abort: ending this rank (exit status 3)")
            sys.stderr.flush()
            os._exit(3)

    def _status(self, binary, *extra):
        command = [binary, "status", "--master-addr", self.addr, "--master-port",
                   str(self.port), *extra]
        try:
            return subprocess.run(command, capture_output=True, text=True,
                                  timeout=STATUS_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            log(f"{' '.join(command)}: {error}")
            return None

    def _print_status(self):
        """`hmc-run status` of the job, printed by the lowest rank that waits (every waiting
        rank printing it would say the same thing N times)."""
        if self.store is None:
            log("where the other ranks are is not known here: no store connection")
            return
        binary = hmc_run_binary()
        if binary is None:
            log("hmc-run was not found (set HMC_RUN to its path, or put it on PATH): run "
                f"`hmc-run status --master-addr {self.addr} --master-port {self.port}` by hand")
            return
        found = self._status(binary, "--json")
        if found is None:
            return
        try:
            ranks = json.loads(found.stdout)["ranks"]
        except (ValueError, KeyError, TypeError):
            log(f"hmc-run status said: {found.stdout.strip()} {found.stderr.strip()}")
            return
        if any(r.get("rank", self.rank) < self.rank and r.get("state") == "waiting"
               for r in ranks):
            return  # a lower rank that waits prints it
        done = self._status(binary)
        if done is None:
            return
        sys.stderr.write(done.stdout)
        if done.returncode not in (0, 3):
            sys.stderr.write(done.stderr)
        sys.stderr.flush()

    def stop(self):
        self.stopping.set()
        FLIGHT.changed.set()
        if self.thread is not None:
            self.thread.join(timeout=2)
        if self.store is not None:
            heartbeat = FLIGHT.heartbeat(self.rank, self.beat)
            heartbeat["state"] = "done"
            self._set(f"heartbeat/{self.rank}", heartbeat)
