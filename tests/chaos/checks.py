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
    if ff is None:
        return None
    return (ff.get("kind"), ff.get("stage"), tuple(sorted(ff.get("ranks") or [])))


def named_in_report(report, rank):
    """Whether an hmc-report/1 names `rank` as not having ended cleanly."""
    for entry in report.get("ranks", []):
        if entry.get("rank") != rank:
            continue
        if entry.get("crashed"):
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
    text = (entry.get("error") or "") + " " + (entry.get("where") or "")
    return entry.get("status") == "missing" and (
        "has ended" in text or "crashed" in text or "was killed" in text)


# --------------------------------------------------------------------------------------------
# Invariants of one execution.

def one_verdict(results, execution, kind):
    """Exactly one verdict line, and one document that parses, whatever the fault."""
    lines = execution.verdict_lines()
    if len(lines) != 1:
        results.wrong("one_verdict", f"{execution.name}: {len(lines)} verdict lines "
                      f"({', '.join(lines) or 'none'}), exit {execution.code}")
    elif execution.document is None:
        results.wrong("one_verdict", f"{execution.name}: no {kind} document "
                      f"({execution.document_error}), exit {execution.code}")
    else:
        results.ok("one_verdict")


def exit_code(results, execution, launcher_code_only=False):
    doc = execution.document
    if doc is None:
        return
    outcome = doc.get("outcome")
    if launcher_code_only:
        # A launcher returns the first non-zero exit of its ranks: zero exactly on a pass.
        if (execution.code == 0) != (outcome == "pass"):
            results.wrong("exit_code", f"{execution.name}: launcher exit {execution.code} with "
                          f"outcome {outcome}")
            return
        stopped = "STOPPED" in execution.verdict_lines() and (doc.get("exit_code") or 0) > 128
        if not stopped and doc.get("exit_code") != EXIT_OF.get(outcome, doc.get("exit_code")):
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


def agree_first_failure(results, x, y):
    px, fx = first_failure(x.document)
    py, fy = first_failure(y.document)
    if not (px and py):
        missing = [e.name for e, p in ((x, px), (y, py)) if not p]
        results.not_checked("agree_first_failure",
                            f"{x.name} vs {y.name}: no first_failure in {', '.join(missing)}")
        return
    if failure_key(fx) != failure_key(fy):
        results.wrong("agree_first_failure", f"{x.name}: {failure_key(fx)}; "
                      f"{y.name}: {failure_key(fy)}")
    else:
        results.ok("agree_first_failure")


def expected_program_outcome(a_doc, meta):
    """What the program on hmc::joinWorld must say, given hmc-run's report of the plan. Two
    differences by design: a `fault crash` is a crash the scenario asked for (a pass when no
    rank waited for it), while the program's rank is really gone: a lost rank, which the
    world's end (a collective of its own) sees as a hang (exit 3); and a leak (what the
    automatic shutdown could not close, e.g. a backward left pending) does not change an
    hmc-run outcome (the contract), while the world's end fails on it (exit 1)."""
    outcome = a_doc.get("outcome")
    if meta["divergence"] == "crash":
        return "hang"
    if outcome == "pass" and (a_doc.get("leaks") or {}).get("leaked"):
        return "fail"
    return outcome


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
    agree_first_failure(results, a, b)


def replay_agrees(results, b, replay):
    if b.document is None:
        return
    if replay is None or replay.document is None:
        results.wrong("replay", f"the recording of {b.name} did not merge or replay "
                      f"({replay.document_error if replay else 'merge failed'})")
        return
    got, want = replay.document.get("outcome"), b.document.get("outcome")
    if got != want:
        results.wrong("replay", f"{b.name} says {want}; its recording replayed on thread ranks "
                      f"says {got}")
    else:
        results.ok("replay")


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
    if is_end:
        wrongly = [r for r in untouched
                   if end_entry(doc, r) is not None and called_crashed_in_end(end_entry(doc, r))]
    else:
        wrongly = [r for r in untouched if r in crashed_ranks(doc)]
    if wrongly:
        results.wrong("no_false_crash", f"{execution.name}: ranks {wrongly}, alive and "
                      "untouched, are called crashed")
    else:
        results.ok("no_false_crash")


def no_false_crash_plain(results, execution, meta):
    """Without a fault from outside: no rank but the plan's crashing one is called crashed."""
    doc = execution.document
    if doc is None:
        return
    untouched = set(range(meta["world"])) - {meta.get("crash_rank")}
    if doc.get("format") == "hmc-world-end/1":
        wrongly = [r for r in untouched
                   if end_entry(doc, r) is not None and called_crashed_in_end(end_entry(doc, r))]
    else:
        wrongly = [r for r in untouched if r in crashed_ranks(doc)]
    if wrongly:
        results.wrong("no_false_crash", f"{execution.name}: ranks {wrongly}, alive and "
                      "untouched, are called crashed")
    else:
        results.ok("no_false_crash")
