"""Random lifecycle plans for the chaos campaign (scripts/chaos, docs/chaos.md).

A plan is an hmc-scenario/1 document: "a user's program", so no step carries `expect` (the
format's default is "ok": any error or hang on any rank makes the run fail, as an error in a
user's program is a failure). Every plan is a function of its seed alone.

A plan has a common program (creates, shares, forwards with and without backward, backwards,
drops, closes, close_all, rebuilds in a `repeat`) and at most one per-rank divergence:
  skip_close    a close (or close_all) that one rank does not run
  reorder_close two closes that one rank runs in the other order
  spec          a create whose `features` differ on one rank
  dtype         a first forward with another dtype on one rank
  crash         `fault crash` on one rank
  stall         `fault stall` on one rank, shorter or longer than the deadline
  none
"""

import random

DIVERGENCES = ["none", "skip_close", "reorder_close", "spec", "dtype", "crash", "stall"]
# The reference runner (../shared/oracle) has no stage tags: ranks that enter different
# collectives are paired by gloo in an order of its own, so a plan whose ranks diverge in the
# collectives they call is not one it can express (docs/scenario-extensions.md,
# `reference_differs`). Those that keep the ranks' collectives in step it can.
ORACLE_EXPRESSES = {"none", "spec", "dtype", "crash", "stall"}
TYPES = ["scratch_linear", "scratch_mlp"]
FEATURES = [8, 16, 32]


class _Program:
    """The common program, generated while tracking what each module is (as every rank
    sees it without divergence), so that most steps are valid uses of the API."""

    def __init__(self, rng):
        self.rng = rng
        self.steps = []
        self.live = {}  # name -> {"type", "features", "bound", "closed", "pending", "shared"}
        self.counter = 0

    def fresh(self, prefix="m"):
        name = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def pick(self, predicate):
        names = sorted(n for n, m in self.live.items() if predicate(m))
        return self.rng.choice(names) if names else None

    def create(self):
        name = self.fresh()
        kind, features = self.rng.choice(TYPES), self.rng.choice(FEATURES)
        self.live[name] = {"type": kind, "features": features, "bound": False, "closed": False,
                           "pending": False, "shared": False}
        self.steps.append({"op": "create", "module": name, "type": kind, "features": features})

    def share(self):
        candidates = sorted(n for n, m in self.live.items()
                            if not m["bound"] and not m["closed"] and not m["shared"])
        for a in candidates:
            for b in candidates:
                ma, mb = self.live[a], self.live[b]
                if a < b and (ma["type"], ma["features"]) == (mb["type"], mb["features"]):
                    ma["shared"] = mb["shared"] = True
                    self.steps.append({"op": "share", "modules": [a, b]})
                    return True
        return False

    def forward(self):
        name = self.pick(lambda m: not m["closed"])
        if name is None:
            return False
        module = self.live[name]
        backward = self.rng.random() < 0.85
        step = {"op": "forward", "module": name}
        if not backward:
            step["backward"] = False
            module["pending"] = True
        module["bound"] = True
        self.steps.append(step)
        return True

    def backward(self):
        name = self.pick(lambda m: m["pending"])
        if name is None:
            return False
        self.live[name]["pending"] = False
        self.steps.append({"op": "backward", "module": name})
        return True

    def drop(self):
        name = self.pick(lambda m: not m["pending"] or self.rng.random() < 0.3)
        if name is None:
            return False
        del self.live[name]
        self.steps.append({"op": "drop", "module": name})
        return True

    def close(self):
        name = self.pick(lambda m: not m["closed"] and (not m["pending"] or self.rng.random() < 0.3))
        if name is None:
            return False
        self.live[name]["closed"] = True
        self.steps.append({"op": "close", "module": name})
        return True

    def close_all(self):
        if any(m["pending"] for m in self.live.values()) and self.rng.random() < 0.7:
            self.backward()
        for module in self.live.values():
            if module["bound"]:
                module["closed"] = True
        self.steps.append({"op": "close_all"})
        return True

    def rebuild(self):
        name = self.fresh("r")
        kind, features = self.rng.choice(TYPES), self.rng.choice(FEATURES)
        self.steps.append({"op": "repeat", "count": self.rng.randint(2, 3), "steps": [
            {"op": "create", "module": name, "type": kind, "features": features},
            {"op": "forward", "module": name},
            {"op": "drop", "module": name}]})
        return True


def _common(rng, length):
    program = _Program(rng)
    actions = [("create", 3), ("forward", 4), ("backward", 1), ("drop", 2), ("close", 2),
               ("close_all", 1), ("rebuild", 1), ("share", 1)]
    names = [a for a, _ in actions]
    weights = [w for _, w in actions]
    program.create()
    while len(program.steps) < length:
        action = rng.choices(names, weights)[0]
        if action == "create" and len(program.live) >= 4:
            action = "forward"
        getattr(program, action)()
    return program


def _others(world, rank):
    return [r for r in range(world) if r != rank]


def _diverge(rng, program, kind, world, rank, timeout):
    """Inserts the divergence into program.steps; returns its description."""
    steps = program.steps
    if kind == "skip_close":
        closes = [i for i, s in enumerate(steps) if s["op"] in ("close", "close_all")]
        if not closes:
            steps.append({"op": "close_all"})
            closes = [len(steps) - 1]
        i = rng.choice(closes)
        steps[i]["ranks"] = _others(world, rank)
        return f"skipped {steps[i]['op']} (step {i}) on rank {rank}"
    if kind == "reorder_close":
        a, b = program.fresh(), program.fresh()
        kind_ = rng.choice(TYPES)
        at = rng.randint(1, len(steps))
        block = [{"op": "create", "module": a, "type": kind_, "features": 16},
                 {"op": "create", "module": b, "type": kind_, "features": 32},
                 {"op": "forward", "module": a}, {"op": "forward", "module": b},
                 {"op": "close", "module": a, "ranks": _others(world, rank)},
                 {"op": "close", "module": b},
                 {"op": "close", "module": a, "ranks": [rank]}]
        steps[at:at] = block
        return f"reordered close (steps {at + 4}-{at + 6}) on rank {rank}"
    if kind == "spec":
        creates = [i for i, s in enumerate(steps) if s["op"] == "create"]
        i = rng.choice(creates)
        other = dict(steps[i], features=[f for f in FEATURES if f != steps[i]["features"]][0],
                     ranks=[rank])
        steps[i]["ranks"] = _others(world, rank)
        steps.insert(i + 1, other)
        return f"another spec (features {other['features']}, step {i + 1}) on rank {rank}"
    if kind == "dtype":
        seen, binds = set(), []
        for i, s in enumerate(steps):
            if s["op"] == "forward" and s["module"] not in seen:
                binds.append(i)
            if s["op"] in ("forward", "create"):
                seen.add(s["module"])
        if not binds:
            return _diverge(rng, program, "spec", world, rank, timeout)
        i = rng.choice(binds)
        other = dict(steps[i], dtype="float64", ranks=[rank])
        steps[i]["ranks"] = _others(world, rank)
        steps.insert(i + 1, other)
        return f"another dtype (float64, step {i + 1}) on rank {rank}"
    if kind == "crash":
        i = rng.randint(1, len(steps))
        steps.insert(i, {"op": "fault", "kind": "crash", "ranks": [rank]})
        return f"crash at step {i} on rank {rank}"
    if kind == "stall":
        long = rng.random() < 0.5
        seconds = round(timeout + rng.uniform(1.0, 2.0), 1) if long else round(rng.uniform(0.2, 0.8), 1)
        i = rng.randint(1, len(steps))
        steps.insert(i, {"op": "fault", "kind": "stall", "seconds": seconds, "ranks": [rank]})
        return f"stall {seconds} s at step {i} on rank {rank}"
    return "no divergence"


def generate(seed, world=None):
    """The plan of `seed`: (scenario document, meta). meta: world, timeout, divergence,
    divergent rank, its description, whether the reference can express it, and the most
    seconds a rank spends stalled on purpose. `world` sets the world size (the hosts mode: 6
    ranks on 3 hosts) in place of the seed's draw."""
    rng = random.Random(seed)
    drawn = rng.choice([2, 2, 3, 3, 4])
    world = world or drawn
    timeout = rng.choice([2, 3])
    program = _common(rng, rng.randint(5, 12))
    divergence = rng.choice(DIVERGENCES)
    rank = rng.randrange(world)
    what = _diverge(rng, program, divergence, world, rank, timeout)
    if rng.random() < 0.5 and program.steps[-1]["op"] != "close_all":
        program.steps.append({"op": "close_all"})
    plan = {"format": "hmc-scenario/1", "name": f"chaos-{seed}",
            "description": f"scripts/chaos plan of seed {seed}: {what}",
            "world_size": world, "device": "cpu", "dtype": "float32", "timeout_s": timeout,
            "steps": program.steps}
    stall = max([s.get("seconds", 0) for s in program.steps if s.get("kind") == "stall"] or [0])
    meta = {"world": world, "timeout": timeout, "divergence": divergence,
            "rank": None if divergence == "none" else rank, "what": what,
            "oracle": divergence in ORACLE_EXPRESSES, "stall_s": stall,
            "crash_rank": rank if divergence == "crash" else None,
            "steps": len(program.steps),
            "collective_steps": sum(1 for s in program.steps
                                    if s["op"] in ("forward", "close", "close_all", "repeat"))}
    return plan, meta
