#!/usr/bin/python3
"""Record and replay (docs/record-replay.md): a run recorded with --record (or HMC_RECORD in a
program) merges into a scenario that replays on thread ranks to the same verdict.

    test_record_replay.py HMC_RUN SOURCE_DIR [EXAMPLE]

Cases:
  - every scenario of scenarios/ recorded on thread ranks, and on tcp rank processes (one run
    of them all each way, one subfolder per scenario): merged,
    replayed on thread ranks; the replay's report equals the original's, timings, step
    numbers, hosts and pids aside (outcome, hang with its diagnosis and the ranks' last
    collectives, mismatches, leaks);
  - the embedding example (a user's program, hmc::joinWorld) under torchrun, 4 ranks, rank 3
    skipping its close: recorded through HMC_RECORD, merged, replayed on 4 thread ranks: a
    hang in the same 'close validation' where rank 3 never arrives, as the program's own report
    said; `hmc-run shrink` makes it at most 2 ranks; the same with --expect observed passes
    (exit 0): the CI test of that failure;
  - `record show` marks the first divergence (table, --json, and --html, which `render` draws
    from the JSON too); the rows every rank repeats fold into one line, the first line names
    the first divergence's row and ranks, --all folds nothing; `record merge` of a folder with
    a torn, a foreign and a missing rank file names each with the reason and merges the rest;
  - a rank process killed with SIGKILL mid-run: the merge keeps its events up to its last call
    and the others', and the replay ends as the run did (fail, exit 1) naming it.

Exit 0 when every case passed, 1 otherwise; a case whose tool is missing is skipped (77 when
nothing failed).
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from cases import Skip, run_cases  # noqa: E402
from ports import reserved_port  # noqa: E402
from torch_probe import torchrun_missing  # noqa: E402

HMC_RUN, SOURCE = sys.argv[1], sys.argv[2]
EXAMPLE = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-k" else ""
PYTHON = "/usr/bin/python3"
TORCHRUN = os.path.join(SOURCE, "tests", "support", "torchrun")
WORK = tempfile.mkdtemp(prefix="hmc-record-replay-")


def run(args, env=None, timeout=120):
    proc = subprocess.run([HMC_RUN] + args, capture_output=True, text=True, timeout=timeout,
                          env=env)
    return proc.returncode, proc.stdout + proc.stderr


# What two runs of the same scenario share: not timings, step numbers (a divergence merges into
# steps of its own), hosts or pids; nor whether a collective that waited for a rank that never
# came ended at its deadline or when that rank's process exited first ("timeout" or
# "rank_failure", "a peer failed": both a hang, as the report says; rank processes race there,
# thread ranks do not).
def normalized(value):
    if isinstance(value, dict):
        out = {k: normalized(v) for k, v in value.items()
               if not (k.endswith("_s") or k in ("seconds", "step", "pid", "host"))}
        if out.get("status") in ("timeout", "rank_failure"):
            out["status"] = "hang"
        return out
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, str):
        # A crash is told as a process's exit status or a thread's fault: the same crash.
        value = re.sub(r"crashed \((?:[^()]|\([^()]*\))*\)", "crashed", value)
        value = value.replace(", a peer failed", "")
        return re.sub(r"step \d+", "step N", value)
    return value


def verdict(doc):
    out = {key: normalized(doc.get(key)) for key in ("outcome", "hang", "mismatches")}
    leaks = doc.get("leaks") or {}
    out["leaks"] = normalized(leaks.get("verdict") if isinstance(leaks, dict) else leaks)
    # A crashed rank process's last collectives are what it published before it died: a race
    # with its own exit, in the original as in any run; its crash is kept, its list is not.
    hang = out.get("hang") or {}
    for rank in hang.get("ranks", []) if isinstance(hang, dict) else []:
        if "crashed" in (hang.get("diagnosis") or "") and rank.get("rank") in crashed(doc):
            rank.pop("last_collectives", None)
    if isinstance(hang, dict) and "diagnosis" in hang:
        hang["diagnosis"] = re.sub(r"; last completed [^;]*$|; no collective completed$", "",
                                   hang["diagnosis"])
    return out


def crashed(doc):
    return {r.get("rank") for r in doc.get("ranks", []) if isinstance(r, dict) and r.get("crashed")}


def reports_of(path):
    with open(path) as f:
        return json.load(f)["reports"]


def round_trip(transport_args):
    """Records every scenario of scenarios/ in one run (one subfolder each, named by the file's
    stem), merges each folder, and replays the merged scenarios in one run on thread ranks;
    each replay's verdict must equal its original's, and the runs' exit codes must agree. One
    run each way rather than one per scenario: every hmc-run process loads LibTorch."""
    paths = scenarios()
    tag = "-".join(transport_args) or "threads"
    folder = os.path.join(WORK, f"recorded-{tag}")
    replays = os.path.join(WORK, f"replays-{tag}")
    os.makedirs(replays)
    first, second = folder + ".1.json", folder + ".2.json"
    code1, out1 = run(paths + ["--record", folder, "--report", first, "-q"] + transport_args,
                      timeout=600)
    merged = []
    for path in paths:
        name = os.path.basename(path)[:-5]
        merged.append(os.path.join(replays, name + ".json"))
        code, out = run(["record", "merge", os.path.join(folder, name), "-o", merged[-1]])
        assert code == 0, f"{name}: merge failed ({code})\n{out}"
    code2, out2 = run(merged + ["--report", second, "-q"], timeout=600)
    originals, replayed = reports_of(first), reports_of(second)
    assert len(originals) == len(replayed) == len(paths), (len(originals), len(replayed))
    for path, original, replay in zip(paths, originals, replayed):
        a, b = verdict(original), verdict(replay)
        assert a == b, (
            f"{os.path.basename(path)} ({transport_args or 'threads'}): the replay differs\n"
            f"original: {json.dumps(a)[:1500]}\nreplay:   {json.dumps(b)[:1500]}")
    assert code1 == code2, f"exit {code1} -> {code2}\n{out1}\n{out2}"


def scenarios():
    return sorted(glob.glob(os.path.join(SOURCE, "scenarios", "*.json")))


def check_threads():
    round_trip([])


def check_tcp_processes():
    round_trip(["--transport", "tcp"])


def check_embedding_skipped_close():
    if not EXAMPLE:
        raise Skip("no embedding example built (HMC_BUILD_EXAMPLES=OFF)")
    missing = torchrun_missing(PYTHON)
    if missing:
        raise Skip(missing)
    folder = os.path.join(WORK, "embedding")
    env = dict(os.environ, HMC_RECORD=folder, HMC_TIMEOUT="3", HMC_NAME="skipped-close")
    proc = subprocess.run(
        [PYTHON, TORCHRUN, "--nnodes", "1", "--nproc_per_node", "4", "--rdzv_backend", "c10d",
         "--rdzv_endpoint", f"127.0.0.1:{reserved_port()}", "--rdzv_id",
         f"hmc-rec-{os.getpid()}-{time.monotonic_ns()}", "--monitor_interval", "0.5",
         "--no_python", EXAMPLE, "--steps", "3", "--skip-close", "3", "--linger", "1"],
        capture_output=True, text=True, timeout=120, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the program's skipped close did not fail\n{text}"
    waited = re.search(r"rank 0 \(\S+\): hang in 'close validation' #(\d+)", text)
    assert waited, f"the program's report does not say rank 0 hung in 'close validation'\n{text}"
    merged = folder + ".json"
    code, out = run(["record", "merge", folder, "-o", merged])
    assert code == 0, out
    code, out = run([merged])
    assert code == 3, f"the replay did not hang (exit {code})\n{out}"
    # The same collective (stage and sequence) where rank 0 waited for rank 1 in vain.
    assert f"# hang: rank 0 waits in 'close validation' #{waited.group(1)} " in out, out
    assert re.search(rf"'close validation' #{waited.group(1)} timed out on rank 0 after [\d.]+ s: "
                     r"ranks \[3\] did not arrive", out), out
    # Then small: at most 2 ranks, the same failure.
    small = folder + "-small.json"
    code, out = run(["shrink", merged, "-o", small, "--max-seconds", "120"], timeout=240)
    assert code == 0, f"shrink failed (exit {code})\n{out}"
    doc = json.load(open(small))
    assert doc["world_size"] <= 2, f"shrunk to {doc['world_size']} ranks\n{out}"
    assert "hang in 'close validation'" in out, out
    # The CI test of that failure: each step expects what it did; passes while it reproduces.
    code, out = run(["record", "merge", folder, "-o", merged, "--expect", "observed"])
    assert code == 0, out
    code, out = run([merged])
    assert code == 0, f"the observed replay did not pass (exit {code})\n{out}"
    code, out = run(["record", "show", folder])
    assert code == 0 and re.search(r"^>\s+\d+ ", out, re.M), out
    first = re.search(r"^# the ranks first differ at event (\d+)", out, re.M)
    assert first, out
    # The same rows as JSON, and as a page (--html, and render of the JSON: the same page).
    code, out = run(["record", "show", folder, "--json"])
    assert code == 0, out
    shown = json.loads(out)
    assert shown["format"] == "hmc-record-show/1" and shown["divergence"] == int(first.group(1)), \
        out[:2000]
    page = folder + "-show.html"
    code, out = run(["record", "show", folder, "--html", page])
    assert code == 0 and "# the ranks first differ at event" in out, out
    html = open(page).read()
    assert f'data-divergence="{first.group(1)}"' in html, html[:2000]
    assert f'<tr id="event-{first.group(1)}" class="diverge"' in html, html[:2000]
    saved = folder + "-show.json"
    with open(saved, "w") as f:
        json.dump(shown, f)
    later = folder + "-later.html"
    code, out = run(["render", saved, "--html", later])
    assert code == 0, out
    assert open(later).read() == html, "render of record show --json differs from --html"


def check_bad_files():
    folder = os.path.join(WORK, "bad")
    code, out = run([os.path.join(SOURCE, "scenarios", "quickstart.json"), "--record", folder,
                     "-q", "--world-size", "4"])
    assert code == 0, out
    rank1 = os.path.join(folder, "rank-1.hmcrec")
    data = open(rank1, "rb").read()
    open(rank1, "wb").write(data[:-40])  # torn
    open(os.path.join(folder, "rank-2.hmcrec"), "w").write("{}\n")  # foreign
    os.remove(os.path.join(folder, "rank-3.hmcrec"))  # missing
    merged = folder + ".json"
    code, out = run(["record", "merge", folder, "-o", merged])
    assert code == 0, out
    assert re.search(r"rank-1\.hmcrec: a torn frame at byte \d+ .* after \d+ events", out), out
    assert "rank-2.hmcrec: byte 0: not an hmc recording" in out, out
    assert "rank-3.hmcrec: missing (the world had 4 ranks)" in out, out
    doc = json.load(open(merged))
    assert doc["world_size"] == 4 and doc["steps"], doc
    code, out = run(["record", "merge", os.path.join(WORK, "nothing-here"), "-o", merged])
    assert code == 2 and "cannot read the recording folder" in out, out
    # A folder that cannot be made is a usage error before anything runs.
    code, out = run([os.path.join(SOURCE, "scenarios", "quickstart.json"), "--record",
                     os.path.join(merged, "under-a-file")])
    assert code == 2 and "cannot create or write to this folder" in out, out
    # Two scenarios of one stem would record into one subfolder: refused before anything runs.
    twin = os.path.join(WORK, "twin", "quickstart.json")
    os.makedirs(os.path.dirname(twin))
    shutil.copy(os.path.join(SOURCE, "scenarios", "quickstart.json"), twin)
    code, out = run([os.path.join(SOURCE, "scenarios", "quickstart.json"), twin, "--record",
                     os.path.join(WORK, "twins")])
    assert code == 2 and "would both record into" in out and twin in out, out
    assert not os.path.exists(os.path.join(WORK, "twins", "quickstart", "rank-0.hmcrec")), out


def check_killed_rank():
    """kill -9 of one rank process of hmc-run's own launcher mid-run (tcp): the other ranks'
    files and the dead rank's, up to its last call, merge (the merge says where its file ends);
    the merged scenario replays on thread ranks to the run's outcome (fail: a crash it did not
    ask for) and exit code, naming the dead rank."""
    folder = os.path.join(WORK, "killed")
    pid_file = os.path.join(WORK, "killed.pids")
    scenario = os.path.join(WORK, "slow-cycles.json")
    cycle = [{"op": "create", "module": "m"}, {"op": "forward", "module": "m"},
             {"op": "drop", "module": "m"}, {"op": "check"},
             {"op": "fault", "kind": "stall", "seconds": 0.05}]
    with open(scenario, "w") as f:
        json.dump({"format": "hmc-scenario/1", "name": "slow-cycles", "world_size": 3,
                   "device": "cpu", "timeout_s": 5,
                   "steps": [{"op": "repeat", "count": 400, "label": "cycles", "steps": cycle},
                             {"op": "close_all"}]}, f)
    env = dict(os.environ, HMC_LAUNCH_PID_FILE=pid_file)
    report = folder + "-report.json"
    proc = subprocess.Popen([HMC_RUN, scenario, "--transport", "tcp", "--record", folder,
                             "--report", report],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        # Mid-run: rank 1 has recorded its first cycles, as `record show` reads its file while
        # it runs (the file is allocated to its cap up front: its size says nothing). A state
        # awaited, not a fixed sleep.
        events = 0
        while time.monotonic() < deadline and events < 20:
            assert proc.poll() is None, proc.communicate()[0]
            # stdout alone: a rank file whose header is not written yet is named on stderr
            # as left out, beside the JSON.
            shown = subprocess.run([HMC_RUN, "record", "show", folder, "--json"],
                                   capture_output=True, text=True, timeout=60)
            if shown.returncode == 0:
                events = {r["rank"]: r["events"]
                          for r in json.loads(shown.stdout)["ranks"]}.get(1, 0)
            time.sleep(0.05)
        pids = [int(x) for x in open(pid_file).read().split()]
        assert len(pids) == 3 and events >= 20, (pids, folder, events)
        os.kill(pids[1], 9)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    original = json.load(open(report))
    ranks = {r["rank"]: r for r in original["ranks"]}
    assert proc.returncode != 0 and ranks[1].get("crashed") and \
        "killed by signal 9" in ranks[1].get("crash_reason", ""), out
    merged = folder + ".json"
    code, out = run(["record", "merge", folder, "-o", merged])
    assert code == 0, out
    ended = re.search(r"rank-1\.hmcrec: .*the file ends after (\d+) events without its end "
                      r"record", out)
    assert ended and int(ended.group(1)) >= 10, out  # killed mid-run, after its first cycles
    doc = json.load(open(merged))
    assert doc["world_size"] == 3 and doc["steps"], doc
    # Ranks 0 and 2 made steps rank 1 never made: those carry "ranks" without 1.
    assert any(1 not in step.get("ranks", [0, 1, 2]) for step in doc["steps"]), \
        json.dumps(doc)[:3000]
    # The others saw rank 1 fail (rank_failure): its crash is not the scenario's own.
    crashes = [s for s in doc["steps"] if s["op"] == "fault" and s.get("kind") == "crash"]
    assert len(crashes) == 1 and crashes[0].get("planned") is False and \
        crashes[0].get("ranks") == [1], crashes
    replay_report = folder + "-replay.json"
    code, out = run([merged, "--timeout", "2", "--report", replay_report], timeout=180)
    # The run's outcome (a crash it did not ask for: fail) and exit code, naming rank 1.
    assert original["outcome"] == "fail" and code == proc.returncode == 1, \
        f"the replay's exit {code}, the run's {proc.returncode} ({original['outcome']})\n{out}"
    replayed = json.load(open(replay_report))
    assert replayed["outcome"] == original["outcome"], replayed["outcome"]
    assert {r["rank"] for r in replayed["ranks"] if r.get("crashed")} == {1}, out
    assert re.search(r"rank 1 (never arrived|crashed|did not arrive)|ranks \[1\] did not arrive",
                     out), out


def check_show_folds():
    """`record show` of a run whose ranks agree for 124 rows and differ at row 124 (rank 2 alone
    stalls): the first line names row 124 and rank 2; rows 0-120 fold into one line, 121-123
    are its context; --all folds nothing; --json keeps every row; the page folds the same rows
    and opens at row 124."""
    scenario = os.path.join(WORK, "fold.json")
    cycle = [{"op": "create", "module": "m"}, {"op": "forward", "module": "m"},
             {"op": "drop", "module": "m"}]
    with open(scenario, "w") as f:
        json.dump({"format": "hmc-scenario/1", "name": "fold", "world_size": 3, "device": "cpu",
                   "timeout_s": 10,
                   "steps": [{"op": "repeat", "count": 40, "steps": cycle},  # rows 0-119
                             {"op": "create", "module": "a"},  # 120
                             {"op": "forward", "module": "a"},  # 121
                             {"op": "forward", "module": "a"},  # 122
                             {"op": "barrier"},  # 123
                             {"op": "fault", "kind": "stall", "seconds": 0.01,
                              "ranks": [2]},  # 124: rank 2 alone
                             {"op": "forward", "module": "a"},
                             {"op": "close_all"}]}, f)
    folder = os.path.join(WORK, "fold")
    code, out = run([scenario, "--record", folder, "-q"])
    assert code == 0, out

    def show(*args):
        proc = subprocess.run([HMC_RUN, "record", "show", folder, *args], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    table = show()
    lines = table.splitlines()
    # The first line says where it went wrong: row 124, rank 2 against ranks 0 and 1.
    assert lines[0].startswith("# the ranks first differ at event 124: rank 2 has 'fault stall' "
                               "where ranks 0, 1 have 'forward a"), table
    fold = [i for i, line in enumerate(lines) if line.startswith("# events ")]
    assert len(fold) == 1 and lines[fold[0]] == \
        "# events 0-120: every rank the same (121 events: 41 create, 40 forward, 40 drop)", table
    rows = [int(m.group(2)) for m in (re.match(r"^([ >])\s*(\d+) ", line) for line in lines)
            if m]
    marked = [line for line in lines if line.startswith(">")]
    assert rows[:4] == [121, 122, 123, 124] and rows == list(range(121, 121 + len(rows))), table
    assert len(marked) == 1 and re.match(r">\s+124 ", marked[0]), table
    assert fold[0] < lines.index(marked[0]), table
    assert lines[-1] == "# the ranks first differ at event 124 (marked >)", table
    # --all: every row, nothing folded.
    every = show("--all")
    rows_all = [int(m.group(1)) for m in (re.match(r"^[ >]\s*(\d+) ", line)
                                          for line in every.splitlines()) if m]
    assert rows_all == list(range(0, rows[-1] + 1)), every
    assert "# events 0-" not in every and every.splitlines()[0] == lines[0], every
    # --json: every row, the divergence with its ranks, the fold's range.
    shown = json.loads(show("--json"))
    assert len(shown["rows"]) == shown["total_rows"] == rows[-1] + 1, shown["total_rows"]
    assert shown["divergence"] == 124 and shown["first_divergence"]["ranks"] == [2] and \
        shown["first_divergence"]["agreeing_ranks"] == [0, 1], shown["first_divergence"]
    assert [(f["first"], f["last"], f["events"]) for f in shown["folds"]] == [(0, 120, 121)], \
        shown["folds"]
    assert json.loads(show("--json", "--all"))["folds"] == []
    # The page: the same rows folded in one collapsed <details>, the top naming row 124 and
    # rank 2, a script that scrolls there; render of the JSON draws the same page.
    page = folder + "-show.html"
    show("--html", page)
    html = open(page).read()
    assert html.count("<details>") == 1, html[:3000]
    folded = html[html.index("<details>"):html.index("</details>")]
    assert folded.count('<tr id="event-') == 121 and '<tr id="event-120">' in folded, folded[:2000]
    assert "The ranks first differ at event 124" in html and \
        "rank 2 has &#39;fault stall&#39; where ranks 0, 1 have" in html, html[:3000]
    assert '<tr id="event-124" class="diverge"' in html, html[:3000]
    assert "getElementById('event-124')" in html, html[-3000:]
    saved = folder + "-show.json"
    with open(saved, "w") as f:
        json.dump(shown, f)
    later = folder + "-later.html"
    code, out = run(["render", saved, "--html", later])
    assert code == 0 and open(later).read() == html, out


CASES = [
    ("round_trip_threads", check_threads),
    ("round_trip_tcp_processes", check_tcp_processes),
    ("embedding_skipped_close_under_torchrun", check_embedding_skipped_close),
    ("bad_files", check_bad_files),
    ("killed_rank", check_killed_rank),
    ("show_folds", check_show_folds),
]


def main():
    only = sys.argv[sys.argv.index("-k") + 1] if "-k" in sys.argv else None
    return run_cases(CASES, only=only, cleanup=lambda: shutil.rmtree(WORK, ignore_errors=True))


if __name__ == "__main__":
    sys.exit(main())
