"""A rank's flight record: the collective it is in, the last one it completed, and the stage
the next exchange belongs to. The reference's exchanges run on the program's thread; the
heartbeat and deadline threads only read, under the lock."""

import os
import socket
import threading
import time


class Flight:
    """Where this rank is, in the words of hmc's heartbeat (hmc-heartbeat/1: FlightEntry)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.epoch = time.monotonic()
        self.sequence = 0          # the next exchange's number
        self.current = None        # the last entry entered (in flight while end_s is None)
        self.last_completed = None
        self.changed = threading.Event()
        self.first_failure = None  # a FailureView-like document, once the program met one
        self._stage = threading.local()

    def now(self):
        return time.monotonic() - self.epoch

    # The stage of the exchanges below this point, on this thread (the reference names some
    # stages only as collective_call's argument; the others by the method that exchanges).
    def stage(self):
        return getattr(self._stage, "name", None) or "exchange"

    def push_stage(self, name):
        previous = getattr(self._stage, "name", None)
        self._stage.name = name
        return previous

    def pop_stage(self, previous):
        self._stage.name = previous

    def enter(self, payload_bytes=0):
        with self.lock:
            entry = {"sequence": self.sequence, "stage": self.stage(), "step": -1,
                     "bytes": payload_bytes, "start_s": self.now(), "end_s": None,
                     "status": "in_flight"}
            self.sequence += 1
            self.current = entry
        self.changed.set()
        return entry

    def leave(self, entry, status):
        with self.lock:
            entry["end_s"] = self.now()
            entry["status"] = status
            if status == "ok":
                self.last_completed = dict(entry)
        self.changed.set()

    def note_failure(self, error):
        """The program's first failure seen through the hooks, as a FailureView document."""
        with self.lock:
            if self.first_failure is not None:
                return
            entry = self.current or {}
            self.first_failure = {
                "rank": int(os.environ.get("RANK", "0")),
                "host": socket.gethostname(),
                "kind": "error",
                "stage": entry.get("stage", ""),
                "sequence": entry.get("sequence"),
                "collectives_before": entry.get("sequence", 0),
                "message": f"{type(error).__name__}: {error}",
            }
        self.changed.set()

    def heartbeat(self, rank, beat):
        """This rank's heartbeat document (hmc-heartbeat/1)."""
        with self.lock:
            current = dict(self.current) if self.current else None
            completed = dict(self.last_completed) if self.last_completed else None
            first = dict(self.first_failure) if self.first_failure else None
        wall = self.now()
        waiting = current is not None and current["end_s"] is None
        if waiting:
            state, in_stage = "waiting", wall - current["start_s"]
        else:
            state = "running"
            in_stage = wall - current["end_s"] if current else 0.0
        out = {"format": "hmc-heartbeat/1", "rank": rank, "state": state, "step": -1,
               "current": current, "last_completed": completed, "in_stage_s": in_stage,
               "wall_s": wall, "written_at": time.time(), "beat": beat,
               "host": socket.gethostname(), "pid": os.getpid()}
        if first:
            out["first_failure"] = first
        return out

    def waiting_for(self):
        """(entry, seconds) of the exchange in flight, or None."""
        with self.lock:
            current = self.current
            if current is None or current["end_s"] is not None:
                return None
            return dict(current), self.now() - current["start_s"]


FLIGHT = Flight()
