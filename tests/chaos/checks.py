"""The chaos campaign's invariants (docs/chaos.md). Each check returns a list of Findings;
a check that cannot be made (a document lacks the field it compares) says so with
`not_checked`, never as passed."""

EXIT_OF = {"pass": 0, "fail": 1, "hang": 3}


class Finding:
    def __init__(self, check, text, status="wrong"):
        self.check, self.text, self.status = check, text, status  # wrong | not_checked

    def __repr__(self):
        return f"{self.check}: {self.text}"


class Results:
    def __init__(self):
        self.findings = []
        self.passed = []  # names of checks made and met

    def wrong(self, check, text):
        self.findings.append(Finding(check, text))

    def not_checked(self, check, text):
        self.findings.append(Finding(check, text, "not_checked"))

    def ok(self, check):
        self.passed.append(check)

    def wrongs(self):
        return [f for f in self.findings if f.status == "wrong"]


# --------------------------------------------------------------------------------------------
# Reading the documents.

def step_failure(report):
    """From hmc-report/1's common fields: (outcome, first unexpected top-level step index or
    None, {rank: status} of the ranks whose entry at that index is unexpected). Ranks that
    left no steps (a dead rank process) are left out."""
    first, where = None, {}
    for rank in report.get("ranks", []):
        for step in rank.get("steps") or []:
            if not step.get("expected", True):
                index = step["index"]
                if first is None or index < first:
                    first, where = index, {}
                if index == first:
                    where[rank["rank"]] = step["status"]
                break
    return report.get("outcome"), first, where


def first_error_text(report):
    """' (first: step I on ranks R, kind: message)' from hmc-report/1's steps, or ''."""
    _, index, where = step_failure(report)
    if index is None:
        return ""
    for rank in report.get("ranks", []):
        for step in rank.get("steps") or []:
            if step["index"] == index and not step.get("expected", True):
                error = step.get("error") or {}
                return (f" (first: step {index} {step['op']} on ranks {sorted(where)}: "
                        f"{step['status']} {error.get('kind', '')}: "
                        f"{(error.get('message') or '')[:100]})")
    return ""


def crashed_ranks(report):
    return {r["rank"] for r in report.get("ranks", []) if r.get("crashed")}


def first_failure(document):
    """(present, value): whether the document has the key at all (the lead's diagnosis
    model, /tmp/coord/DIAGNOSIS.md), and its value."""
    if document is None or "first_failure" not in document:
        return False, None
    return True, document["first_failure"]


def failure_key(ff):
    """What two first failures must share: kind and the ranks named (stage compared apart,
    where both have one)."""
    if ff is None:
        return None
    return (ff.get("kind"), tuple(sorted(ff.get("ranks") or [])))


def leaked_ranks(report):
    """The ranks whose own leak record in an hmc-report/1 says leaked."""
    return {r.get("rank") for r in ((report.get("leaks") or {}).get("ranks") or [])
            if r.get("leaked")}


def named_in_report(report, rank):
    """Whether an hmc-report/1 names `rank` as not having ended cleanly."""
    for entry in report.get("ranks", []):
        if entry.get("rank") != rank:
            continue
        if entry.get("crashed") or entry.get("stopped"):
            return True
        if any(not s.get("expected", True) for s in entry.get("steps") or []):
            return True
    hang = report.get("hang") or {}
    return f"rank {rank} " in (hang.get("diagnosis") or "")


def end_entry(document, rank):
    for entry in (document or {}).get("ranks", []):
        if entry.get("rank") == rank:
            return entry
    return None


def ended_cleanly_in_end(document, rank):
    entry = end_entry(document, rank)
    return entry is not None and entry.get("status") == "ok"


def called_crashed_in_end(entry):
    if entry.get("result_lost"):
        return False  # its end had no way to the reporter: "not known here", never a crash
    text = (entry.get("error") or "") + " " + (entry.get("where") or "")
    return entry.get("status") == "missing" and (
        "has ended" in text or "crashed" in text or "was killed" in text)


# --------------------------------------------------------------------------------------------
# Invariants of one execution.

def one_verdict(results, execution, kind):
    """Exactly one verdict line, and one document that parses, whatever the fault."""
    lines = execution.verdict_lines()
    if not lines and kind == "hmc-world-end/1" and \
            "# driver: joining the world" not in execution.output:
        # No rank reached hmc::joinWorld (the driver prints that line first): a launcher that
        # tore the job down while the processes still loaded LibTorch left hmc nothing to run.
        results.not_checked("one_verdict", f"{execution.name}: torn down (exit "
                            f"{execution.code}) before any rank reached joinWorld")
        return
    if len(lines) != 1:
        results.wrong("one_verdict", f"{execution.name}: {len(lines)} verdict lines "
                      f"({', '.join(lines) or 'none'}), exit {execution.code}")
    elif execution.document is None:
        results.wrong("one_verdict", f"{execution.name}: no {kind} document "
                      f"({execution.document_error}), exit {execution.code}")
    else:
        results.ok("one_verdict")


def exit_code(results, execution, launcher_code_only=False, planned_crash_rank=None):
    doc = execution.document
    if doc is None:
        return
    outcome = doc.get("outcome")
    if launcher_code_only:
        # A launcher returns the first non-zero exit of its ranks: zero exactly on a pass, but
        # for a plan's own `fault crash`, whose rank process exits 17 while hmc-run's outcome
        # passes it (the reference runner's rule, documented in agree_first_failure).
        planned_crash = execution.code == 17 and outcome == "pass" and \
            planned_crash_rank is not None
        if (execution.code == 0) != (outcome == "pass") and not planned_crash:
            results.wrong("exit_code", f"{execution.name}: launcher exit {execution.code} with "
                          f"outcome {outcome}")
            return
        stopped = "STOPPED" in execution.verdict_lines() and (doc.get("exit_code") or 0) > 128
        # hmc-report/1 (hmc-run under a launcher) has no exit_code of its own.
        if "exit_code" in doc and not stopped and \
                doc.get("exit_code") != EXIT_OF.get(outcome, doc.get("exit_code")):
            results.wrong("exit_code", f"{execution.name}: document exit_code "
                          f"{doc.get('exit_code')} with outcome {outcome}")
            return
    elif execution.code != EXIT_OF.get(outcome):
        results.wrong("exit_code", f"{execution.name}: exit {execution.code} with outcome {outcome}")
        return
    results.ok("exit_code")


def bounded(results, execution, bound_s, what):
    if execution.killed_by_harness or execution.wall > bound_s:
        results.wrong("bounded", f"{execution.name}: ran {execution.wall:.1f} s, bound "
                      f"{bound_s:.1f} s ({what})"
                      + (": killed by the harness" if execution.killed_by_harness else ""))
    else:
        results.ok("bounded")


def nothing_left(results, execution, files_too=True):
    if execution.leftover_processes:
        results.wrong("nothing_left", f"{execution.name}: processes alive after its end: "
                      + "; ".join(execution.leftover_processes))
    elif files_too and execution.leftover_files:
        results.wrong("nothing_left", f"{execution.name}: left in its TMPDIR: "
                      + ", ".join(execution.leftover_files))
    else:
        results.ok("nothing_left")


# --------------------------------------------------------------------------------------------
# Agreement between executions of one plan.

def agree_steps(results, a, c):
    """hmc-run against the reference: outcome and the first failing step, with the ranks
    where it failed and their statuses (ranks either side reports crashed left out)."""
    if a.document is None or c.document is None:
        return
    ranks = c.document.get("ranks") or []
    if ranks and all(not r.get("steps") for r in ranks):
        # The reference runner's ranks ran no step (each "crashed", or not): its world did not form
        # (under load, a rank whose plan crashes at once can end before the others finished
        # torch.distributed's init: "Connection reset by peer"), and its report then says pass
        # with no step. No verdict of the reference to compare with.
        for check in ("agree_outcome", "agree_first_step"):
            results.not_checked(check, f"{c.name}: the reference ran no step (its world did not "
                                       "form; see its output)")
        return
    oa, ia, wa = step_failure(a.document)
    oc, ic, wc = step_failure(c.document)
    dead = crashed_ranks(a.document) | crashed_ranks(c.document)
    wa = {r: s for r, s in wa.items() if r not in dead}
    wc = {r: s for r, s in wc.items() if r not in dead}
    if oa != oc:
        results.wrong("agree_outcome", f"{a.name} says {oa}, {c.name} says {oc}")
    else:
        results.ok("agree_outcome")
    if (ia, wa) != (ic, wc):
        results.wrong("agree_first_step", f"{a.name}: first unexpected step {ia} on {wa}; "
                      f"{c.name}: step {ic} on {wc}")
    else:
        results.ok("agree_first_step")


def same_failure(fx, fy):
    """'' when two first_failure values agree (kind, ranks; stage where both have one), else
    what differs."""
    if (fx is None) != (fy is None):
        return "one has none"
    if fx is None:
        return ""
    if failure_key(fx) != failure_key(fy):
        return "kind/ranks differ"
    sx, sy = fx.get("stage") or "", fy.get("stage") or ""
    if sx and sy and sx != sy:
        return "stage differs"
    return ""


def show_failure(ff):
    if ff is None:
        return "none"
    return (f"{ff.get('kind')} in '{ff.get('stage') or ''}' ranks {sorted(ff.get('ranks') or [])}"
            f": {(ff.get('line') or '')[:160]}")


def agree_first_failure(results, a, b, meta):
    """hmc-run's report (a) against the program's world end (b): first_failure's kind and
    ranks, and its stage where both name one. The two documented differences (docs/chaos.md,
    'agree_first_failure'), as agree_outcome's:
    - a plan's `fault crash` is the reference runner's rule in hmc-run: a planned crash that no
      rank waited for does not fail the scenario (first_failure null); in the program the
      rank's process is really gone, so the world's end has a crash (HUNG) naming that rank;
    - a leak at the end (a group the automatic shutdown could not close) fails a program's
      world end (kind "leak", the leaking ranks, or the error its collective close raised,
      which is hmc-run's shutdown_error) but not an hmc-run outcome (null)."""
    pa, fa = first_failure(a.document)
    pb, fb = first_failure(b.document)
    if not (pa and pb):
        missing = [e.name for e, p in ((a, pa), (b, pb)) if not p]
        results.not_checked("agree_first_failure",
                            f"{a.name} vs {b.name}: no first_failure in {', '.join(missing)}")
        return
    why = same_failure(fa, fb)
    # A rank process of hmc-run that died leaves no steps (the reference's rule, the contract's
    # `crashed`), so what it met before is not in hmc-run's report; the program's world end
    # knows it from the rank's heartbeat. Those ranks are left out of the comparison, as in
    # agree_first_step.
    why = unblind(why, fa, fb, a.document, b.document)
    # Documented difference 3: the program's world did not form (its rank 0 crashed by plan
    # right after its own join, while the others joined): the same crash, named at 'join',
    # where hmc-run's thread ranks, which have no join, name the collective they waited in.
    if why == "stage differs" and (fb or {}).get("stage") == "join":
        why = ""
    if why and fa is None and fb is not None:
        # Documented difference 1: the planned crash, which hmc-run lets pass.
        if meta["divergence"] == "crash" and fb.get("kind") in ("crash", "hang") and \
                sorted(fb.get("ranks") or []) == [meta["crash_rank"]]:
            why = ""
        # Documented difference 2: a leak at the end, which only the world's end fails on.
        elif fb.get("kind") == "leak" and (a.document.get("leaks") or {}).get("leaked") and \
                set(fb.get("ranks") or []) <= leaked_ranks(a.document):
            why = ""
        # The same, where the world's collective close at the end raised what hmc-run's
        # automatic shutdown did (its leaks' shutdown_error): "multicore cleanup requires idle
        # workspaces ..." for a backward left pending.
        elif fb.get("kind") in ("error", "manifest_mismatch") and \
                set(fb.get("ranks") or []) <= leaked_ranks(a.document) and \
                any(shutdown_error_is(r.get("shutdown_error"), fb)
                    for r in (a.document.get("leaks") or {}).get("ranks") or []):
            why = ""
    if why:
        results.wrong("agree_first_failure", f"{why}: {a.name}: {show_failure(fa)}; "
                      f"{b.name}: {show_failure(fb)}")
    else:
        results.ok("agree_first_failure")


def unblind(why, fa, fb, *docs):
    """same_failure's verdict with the ranks an hmc-run report is blind to left out: a rank
    process that died (`crashed`) or that a launcher's teardown stopped before its result came
    (`stopped`) has no steps, so what it met before is not in that report (the reference's
    rule for a dead rank process); the other document may know it."""
    if why != "kind/ranks differ" or fa is None or fb is None:
        return why
    blind = {r["rank"] for doc in docs if (doc or {}).get("format") == "hmc-report/1"
             for r in doc.get("ranks", [])
             if (r.get("crashed") or r.get("stopped")) and not r.get("steps")}
    if blind and fa.get("kind") == fb.get("kind") and \
            set(fa.get("ranks") or []) - blind == set(fb.get("ranks") or []) - blind:
        return same_failure(dict(fa, ranks=[]), dict(fb, ranks=[]))
    return why


def shutdown_error_is(error, ff):
    """Whether hmc-run's automatic shutdown raised what the world's close at its end did."""
    if not error:
        return False
    if ff.get("kind") == "manifest_mismatch":
        return "manifests differ" in error or "specifications differ" in error
    return error in (ff.get("line") or "")


def outcome_of(ff):
    """The outcome a first failure gives (/tmp/coord/DIAGNOSIS.md, exit codes): none a pass;
    a hang, or a crash (a lost rank), a hang (exit 3); any other kind a failure (exit 1);
    None for `stopped` (the launcher's signal: exit 128 + the signal, no outcome of its own)."""
    if ff is None:
        return "pass"
    kind = ff.get("kind")
    if kind == "stopped":
        return None
    return "hang" if kind in ("hang", "crash") else "fail"


def expected_program_outcome(a_doc, meta):
    """What the program on hmc::joinWorld must say, given hmc-run's report of the plan: its
    first failure's outcome (the world's end leads with it), with the two documented
    differences (agree_first_failure) where hmc-run has none: a `fault crash` that hmc-run
    lets pass is a lost rank in the program (hang, exit 3); a leak that does not change an
    hmc-run outcome fails the world's end (exit 1). Where hmc-run's report has no
    first_failure yet, its outcome."""
    present, ff = first_failure(a_doc)
    if present and ff is not None:
        return outcome_of(ff) or a_doc.get("outcome")
    if meta["divergence"] == "crash":
        return "hang"
    leaks = a_doc.get("leaks") or {}
    if leaks.get("leaked") and a_doc.get("outcome") == "pass" and \
            not only_unbound_groups_left(leaks):
        return "fail"
    return a_doc.get("outcome")


def only_unbound_groups_left(leaks):
    """Whether every leaked rank of hmc-run's `leaks` holds only groups that never bound (no
    bound group, no workspace, no byte): the reference's automatic shutdown is registered at a
    module's first binding, so a program whose modules never bound leaves their groups, where
    the world's end closes every group of the manager (closeGroups) and leaves none."""
    return all(r.get("bound_groups", 0) == 0 and r.get("workspaces_held", 0) == 0 and
               r.get("bytes_held", 0) == 0
               for r in leaks.get("ranks") or [] if r.get("leaked"))


def outcome_follows_first_failure(results, execution):
    """A program's world end has its first failure's outcome (exit 1 when the first failure
    is not a hang, 3 when it is). hmc-run's report keeps the reference runner's table for its
    `outcome` (an unexpected hang anywhere makes it `hang`, a crash `fail`: the contract of
    hmc-report/1, which the differential test holds to the reference), so only its first
    failure is compared with the program's (agree_program), not its outcome."""
    if (execution.document or {}).get("format") != "hmc-world-end/1":
        return
    present, ff = first_failure(execution.document)
    if not present:
        return
    want, got = outcome_of(ff), execution.document.get("outcome")
    if want is None:
        return
    if got != want:
        results.wrong("outcome_follows_first_failure", f"{execution.name}: outcome {got}, "
                      f"but its first failure ({show_failure(ff)}) gives {want}")
    else:
        results.ok("outcome_follows_first_failure")


def agree_program(results, a, b, meta):
    if a.document is None or b.document is None:
        return
    want = expected_program_outcome(a.document, meta)
    got = b.document.get("outcome")
    if got != want:
        leaked = " (leaked)" if (a.document.get("leaks") or {}).get("leaked") else ""
        results.wrong("agree_outcome", f"{b.name} says {got}; {a.name} says "
                      f"{a.document.get('outcome')}{leaked}{first_error_text(a.document)}, so "
                      f"{want} was expected")
    else:
        results.ok("agree_outcome")
    agree_first_failure(results, a, b, meta)


def replay_agrees(results, b, replay, meta=None):
    """(b)'s recording, merged and replayed on thread ranks, gives (b)'s verdict: its outcome
    (`replay`) and its first failure's kind and ranks, and stage where both have one
    (`replay_first_failure`). The replay is an hmc-run scenario: the documented differences of
    agree_first_failure hold (a plan's own crash that no rank waited for passes there)."""
    if b.document is None:
        return
    pb, fb = first_failure(b.document)
    if fb is not None and fb.get("stage") == "join":
        for check in ("replay", "replay_first_failure"):
            results.not_checked(check, f"{b.name}: its world did not form: its recordings hold "
                                "no world to replay")
        return
    planned = meta is not None and meta.get("divergence") == "crash" and fb is not None and \
        fb.get("kind") in ("crash", "hang") and sorted(fb.get("ranks") or []) == \
        [meta.get("crash_rank")]
    if planned and replay is not None and replay.document is not None and \
            replay.document.get("outcome") == "pass":
        results.ok("replay")
        results.ok("replay_first_failure")
        return
    if replay is None or replay.document is None:
        results.wrong("replay", f"the recording of {b.name} did not merge or replay "
                      f"({replay.document_error if replay else 'merge failed'})")
        return
    got, want = replay.document.get("outcome"), b.document.get("outcome")
    pb, fb = first_failure(b.document)
    pr, fr = first_failure(replay.document)
    if pb and pr and fr is not None and outcome_of(fr) and outcome_of(fb):
        # Compared by what each first failure gives: a replay whose own outcome does not
        # follow its first failure is outcome_follows_first_failure's finding, not this one's.
        got, want = outcome_of(fr), outcome_of(fb)
    if got != want:
        results.wrong("replay", f"{b.name} says {want}; its recording replayed on thread ranks "
                      f"says {got}")
    else:
        results.ok("replay")
    if not (pb and pr):
        results.not_checked("replay_first_failure", "no first_failure in "
                            + ", ".join(n for n, p in ((b.name, pb), ("replay", pr)) if not p))
        return
    why = same_failure(fb, fr)
    # A leak is not an hmc-run outcome (the documented difference of agree_first_failure): a
    # replay of a program that leaked passes.
    if why and fr is None and fb.get("kind") == "leak":
        why = ""
    if why:
        results.wrong("replay_first_failure", f"{why}: {b.name}: {show_failure(fb)}; its "
                      f"replay: {show_failure(fr)}")
    else:
        results.ok("replay_first_failure")


# --------------------------------------------------------------------------------------------
# Faults from outside.

def fault_named(results, execution, baseline, meta):
    """A killed rank is named as crashed/missing, never as ended cleanly; a stopped rank
    that changed the outcome is named; no other rank alive and untouched is called crashed."""
    fault, doc = execution.fault, execution.document
    if doc is None or not fault or not fault.get("delivered"):
        return
    rank = fault["rank"]
    is_end = doc.get("format") == "hmc-world-end/1"
    named = (not ended_cleanly_in_end(doc, rank)) if is_end else named_in_report(doc, rank)
    if fault["kind"] == "sigkill":
        if named:
            results.ok("fault_named")
        elif fault.get("after_report"):
            results.not_checked("fault_named", f"{execution.name}: the SIGKILL came after the "
                                "verdict line")
        elif execution.ended_before_fault:
            results.not_checked("fault_named", f"{execution.name}: rank {rank} had reached its "
                                "end before the SIGKILL (its recording's end record)")
        else:
            results.wrong("fault_named", f"{execution.name}: rank {rank} was killed "
                          f"(SIGKILL at +{fault['at'] - execution.start:.1f} s) and the report "
                          "says it ended cleanly")
    elif fault["kind"] == "sigstop":
        changed = baseline is not None and baseline.document is not None and \
            baseline.document.get("outcome") != doc.get("outcome")
        if changed and not named:
            results.wrong("fault_named", f"{execution.name}: rank {rank} was stopped "
                          f"{fault.get('seconds', 0):g} s, the outcome changed to "
                          f"{doc.get('outcome')}, and the report says rank {rank} ended cleanly")
        else:
            results.ok("fault_named")
    untouched = set(range(meta["world"])) - {rank, meta.get("crash_rank")}
    report_false_crashes(results, execution, untouched)


def no_false_crash_plain(results, execution, meta):
    """Without a fault from outside: no rank but the plan's crashing one is called crashed."""
    doc = execution.document
    if doc is None:
        return
    untouched = set(range(meta["world"])) - {meta.get("crash_rank")}
    report_false_crashes(results, execution, untouched)


def report_false_crashes(results, execution, untouched):
    """no_false_crash: none of the `untouched` ranks (alive, not faulted) is called crashed."""
    doc = execution.document
    if doc.get("format") == "hmc-world-end/1":
        wrongly = [r for r in untouched
                   if end_entry(doc, r) is not None and called_crashed_in_end(end_entry(doc, r))]
    else:
        wrongly = [r for r in untouched if r in crashed_ranks(doc)]
    if wrongly:
        results.wrong("no_false_crash", f"{execution.name}: ranks {sorted(wrongly)}, alive and "
                      "untouched, are called crashed")
    else:
        results.ok("no_false_crash")


# --------------------------------------------------------------------------------------------
# The hosts mode (tests/chaos/hosts.py): a plan of 6 ranks under mpirun on 3 hosts.

def agree_hosts(results, a, f, meta, program):
    """Without a fault delivered: the run across hosts says what the baseline (hmc-run on
    thread ranks here) says: for the driver with agree_program's documented differences; for
    hmc-run the same outcome and first failure (kind, ranks; stage where both have one)."""
    if a.document is None or f.document is None:
        return
    if program == "driver":
        agree_program(results, a, f, meta)
        return
    oa, of = a.document.get("outcome"), f.document.get("outcome")
    if oa != of:
        results.wrong("agree_outcome", f"{f.name} (hmc-run across hosts) says {of}; {a.name} "
                      f"(thread ranks) says {oa}{first_error_text(a.document)}")
    else:
        results.ok("agree_outcome")
    pa, fa = first_failure(a.document)
    pf, ff = first_failure(f.document)
    if not (pa and pf):
        results.not_checked("agree_first_failure", "no first_failure in one of them")
        return
    why = unblind(same_failure(fa, ff), fa, ff, a.document, f.document)
    if why:
        results.wrong("agree_first_failure", f"{why}: {a.name}: {show_failure(fa)}; "
                      f"{f.name}: {show_failure(ff)}")
    else:
        results.ok("agree_first_failure")


def expected_outcome(a_doc, meta, program):
    return expected_program_outcome(a_doc, meta) if program == "driver" else a_doc.get("outcome")


def ended_before_fault(doc, ranks, steps):
    """Whether the document shows every one of `ranks` at its end: an hmc-report/1 entry with
    its `steps` results and its final state, neither crashed nor stopped (its result came
    before the fault); a world end's entry with status ok."""
    for rank in ranks:
        entry = end_entry(doc, rank)
        if entry is None:
            return False
        if doc.get("format") == "hmc-world-end/1":
            if entry.get("status") != "ok":
                return False
        elif entry.get("crashed") or entry.get("stopped") or "final" not in entry or \
                len(entry.get("steps") or []) < steps:
            return False
    return True


def fault_mattered(f, baseline, meta, program):
    """Whether the fault from outside changed the verdict: a lost node unless its ranks had
    ended, their results in (the loss then came during the job's own end: the launcher's
    exit says so, the program's verdict stands); a partition or a stop when the outcome is not
    the baseline's, or the first failure names a rank it touched."""
    fault, doc = f.fault or {}, f.document or {}
    if fault.get("kind") == "lost_node":
        return not ended_before_fault(doc, fault.get("ranks") or [], meta.get("steps", 0))
    want = expected_outcome(baseline.document, meta, program) if baseline.document else None
    ff = doc.get("first_failure") or {}
    if doc.get("outcome") != want:
        return True
    if not set(ff.get("ranks") or []) & set(fault.get("ranks") or []):
        return False
    # The first failure names a rank the fault touched: the fault's doing, unless it is the
    # plan's own, as the unfaulted baseline names it (a divergence of a rank on that host).
    base = (baseline.document or {}).get("first_failure") or {}
    return (ff.get("kind"), sorted(ff.get("ranks") or [])) != \
        (base.get("kind"), sorted(base.get("ranks") or []))


def host_named(doc, rank, host, lost=False):
    """Whether a document names `rank` as not having ended cleanly, with its host `host`:
    the first failure lists both, or the rank's own entry is not clean and has that host.
    `lost` (its process was killed): its entry must say so, as crashed (hmc-run) or missing
    (the world end), not as a rank that waits or was stopped by a teardown, as the live ones
    are."""
    ff = doc.get("first_failure") or {}
    if rank in (ff.get("ranks") or []) and host in (ff.get("hosts") or []):
        return True
    if ff.get("stage") == "join" and rank in (ff.get("ranks") or []):
        # A world that did not form names the ranks that had not joined its store: such a rank
        # never told anyone its host (mpirun's own output names it), so by rank alone.
        return True
    entry = end_entry(doc, rank)
    if entry is not None and entry.get("joined") is False:
        # hmc-run's report of a world that did not form: a rank that had not joined its
        # store (never said its host), named as such beside a first failure of others.
        return True
    if entry is None or entry.get("host") != host:
        return False
    if doc.get("format") == "hmc-world-end/1":
        if not lost:
            return entry.get("status") != "ok"
        # Killed: no end of its own ("missing"), or an end that failed which it published before
        # the kill (a hang's or an error's end comes at its deadline, from the rank itself: the
        # node was lost after it; --modes hosts --run-seed 1051982539). Never "stopped" (a live
        # rank at the teardown) nor a clean end beside a lost host's failure.
        return entry.get("status") in ("missing", "hang", "error")
    return bool(entry.get("crashed")) if lost else named_in_report(doc, rank)


def host_fault_named(results, f, baseline, meta, program):
    """Every faulted rank named with its host where the fault mattered; no rank alive and
    untouched (neither faulted nor the plan's crashing one) called crashed."""
    fault, doc = f.fault or {}, f.document
    if doc is None or not fault.get("delivered"):
        return
    touched = set(fault.get("ranks") or [])
    if fault.get("after_report"):
        results.not_checked("fault_named", f"{f.name}: the fault came after the verdict line")
    elif baseline.document is None or not fault_mattered(f, baseline, meta, program):
        results.not_checked("fault_named", f"{f.name}: the fault did not change the verdict")
    else:
        lost = fault["kind"] == "lost_node"
        unnamed = [r for r in sorted(touched) if not host_named(doc, r, fault["host"], lost)]
        if unnamed:
            results.wrong("fault_named", f"{f.name}: {fault['kind']} of {fault['host']} "
                          f"(ranks {sorted(touched)}): ranks {unnamed} are not named with host "
                          f"{fault['host']}; first failure: {show_failure(doc.get('first_failure'))}")
        else:
            results.ok("fault_named")
    untouched = set(range(meta["world"])) - touched - {meta.get("crash_rank")}
    if doc.get("format") == "hmc-world-end/1":
        wrongly = [r for r in sorted(untouched)
                   if end_entry(doc, r) is not None and called_crashed_in_end(end_entry(doc, r))]
    else:
        wrongly = sorted(r for r in untouched if r in crashed_ranks(doc))
    if wrongly:
        results.wrong("no_false_crash", f"{f.name}: ranks {wrongly}, alive and untouched by "
                      f"the {fault['kind']} of {fault['host']}, are called crashed")
    else:
        results.ok("no_false_crash")


def report_in_time(results, f, baseline, meta, program):
    """Where the fault mattered, the verdict line arrives within the deadline + 2 s of the
    fault (+ the plan's own stalls, which may hold rank 0, the reporter)."""
    fault = f.fault or {}
    if not fault.get("delivered") or fault.get("after_report"):
        return
    if baseline.document is None or f.document is None or \
            not fault_mattered(f, baseline, meta, program):
        results.not_checked("report_in_time", f"{f.name}: the fault did not change the verdict")
        return
    bound = meta["timeout"] + 2 + meta["stall_s"]
    if fault.get("joined") is False and fault.get("kind") in ("partition", "sigstop"):
        # Before the world formed the ranks wait in the join, bounded by the join timeout
        # (minutes), not by a collective's deadline: the fault's end comes first.
        bound += fault.get("seconds") or 0
    if f.verdict_at is None:
        results.wrong("report_in_time", f"{f.name}: no verdict line after the {fault['kind']}")
        return
    after = f.verdict_at - fault["at"]
    if after > bound:
        results.wrong("report_in_time", f"{f.name}: the verdict line came {after:.1f} s after "
                      f"the {fault['kind']} of {fault['host']}, bound {bound:g} s (deadline "
                      f"{meta['timeout']} s + 2 s + planned stalls {meta['stall_s']:g} s)")
    else:
        results.ok("report_in_time")


def host_nothing_left(results, f, box):
    """Nothing of the run left: no process of it (by its mark) or of the box's hosts alive
    3 s after mpirun's end, no file in a host's TMPDIR (but a lost node's: what a machine that
    lost power leaves on its own disk is its own), and no namespace, process or folder of the
    box after its removal."""
    problems = []
    if f.leftover_processes:
        problems.append("processes alive after its end: " + "; ".join(f.leftover_processes))
    if f.box_left:
        problems.append("processes on the hosts 3 s after mpirun's end: " + "; ".join(f.box_left))
    if f.leftover_files:
        problems.append("left in h1's TMPDIR: " + ", ".join(f.leftover_files))
    for host, names in sorted(f.host_files.items()):
        problems.append(f"left in {host}'s TMPDIR: " + ", ".join(names))
    left = box.left or {}
    if any(left.values()):
        problems.append(f"the box's removal left {left}")
    if problems:
        results.wrong("nothing_left", f"{f.name}: " + "; ".join(problems))
    else:
        results.ok("nothing_left")
