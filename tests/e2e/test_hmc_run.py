#!/usr/bin/python3
"""End-to-end tests of the hmc-run binary (CTest label e2e). Standard library only.

usage: test_hmc_run.py HMC_RUN [REPO_ROOT]

Runs hmc-run on every scenario of scenarios/ (outcome pass, exit 0), on the directory, on
failing, invalid and hanging inputs (exit 1, 2, 3), and checks the --report JSON (every
conformance field of hmc-report/1 and hmc's sections), the --trace JSON (one process per
rank, flow events), the validate and list subcommands and --help.
Prints one line per check and a closing "N passed, N failed"; exits 1 on any failure.
"""
import functools
import glob
import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HMC_RUN = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
REPO = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCENARIOS = os.path.join(REPO, "scenarios")
DATA = os.path.join(REPO, "tests", "e2e", "data")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
import shard  # noqa: E402
SHARD = shard.parse(sys.argv)  # --shard K/N: every N-th check, from the K-th
WORK = tempfile.mkdtemp(prefix="hmc-e2e-")

RESULTS = {"passed": 0, "failed": 0}


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def run(*args, timeout=120):
    """Runs hmc-run on CPU (so that the results do not depend on a GPU); returns the process."""
    return subprocess.run([HMC_RUN, *args], capture_output=True, text=True, timeout=timeout)


def run_cpu(*args, timeout=120):
    return run(*args, "--device", "cpu", timeout=timeout)


def output(proc):
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-2000:]}"


def test(function):
    """Runs one check function; records and prints its result."""
    name = function.__name__
    start = time.monotonic()
    try:
        function()
    except Failure as failure:
        RESULTS["failed"] += 1
        print(f"FAIL  {name}: {failure}", flush=True)
        return
    except Exception:  # noqa: BLE001
        RESULTS["failed"] += 1
        print(f"FAIL  {name}: {traceback.format_exc()}", flush=True)
        return
    RESULTS["passed"] += 1
    print(f"ok    {name} ({time.monotonic() - start:.1f} s)", flush=True)


def library():
    """The CPU scenarios of scenarios/. GPU scenarios (device "cuda", scenarios/gpu/*.json) are
    left out: these tests run everything with --device cpu, and scripts/device-check runs them
    on a GPU."""
    files = []
    for path in sorted(glob.glob(os.path.join(SCENARIOS, "*.json"))):
        if load(path).get("device") == "cuda":
            print(f"skip  {os.path.basename(path)}: device 'cuda' (scripts/device-check runs it)")
            continue
        files.append(path)
    check(len(files) >= 17, f"expected at least 17 scenarios in {SCENARIOS}, found {len(files)}")
    return files


def library_directory():
    """A directory holding exactly library()'s files (links), for the directory runs."""
    directory = os.path.join(WORK, "library")
    if not os.path.isdir(directory):
        os.makedirs(directory)
        for path in library():
            os.symlink(path, os.path.join(directory, os.path.basename(path)))
    return directory


def load(path):
    with open(path) as fh:
        return json.load(fh)


# ---- report shape ---------------------------------------------------------------------------

STEP_STATUSES = {"ok", "error", "hang", "skipped", "not_run"}
ERROR_KINDS = {"runtime_error", "value_error", "type_error", "timeout", "check_failed",
               "collective_mismatch", "rank_failure"}
TIMING_KEYS = ("fresh_bind", "reused_bind", "close", "exchange")


def check_report(report, scenario, where):
    """Every conformance field of hmc-report/1 and hmc's sections, against the scenario."""
    check(report.get("format") == "hmc-report/1", f"{where}: format {report.get('format')!r}")
    check(report.get("scenario") == scenario["name"], f"{where}: scenario {report.get('scenario')!r}")
    world = scenario.get("world_size", 1)
    check(report.get("world_size") == world, f"{where}: world_size {report.get('world_size')!r}")
    check(report.get("outcome") in ("pass", "fail", "hang"), f"{where}: outcome {report.get('outcome')!r}")
    ranks = report.get("ranks")
    check(isinstance(ranks, list) and [r.get("rank") for r in ranks] == list(range(world)),
          f"{where}: ranks {[r.get('rank') for r in ranks or []]}")
    for rank in ranks:
        steps = rank.get("steps")
        if rank.get("crashed") and steps is None:
            # A crashed rank process (store, gloo) cannot report its steps or final state, as
            # in the reference: the entry has neither.
            check("final" not in rank, f"{where}: rank {rank['rank']} crashed without a result has a final")
            check(isinstance(rank.get("crash_reason"), str), f"{where}: rank {rank['rank']} crash_reason")
            continue
        check(isinstance(steps, list) and len(steps) == len(scenario["steps"]),
              f"{where}: rank {rank['rank']} has {len(steps or [])} steps, the scenario {len(scenario['steps'])}")
        for index, (step, spec) in enumerate(zip(steps, scenario["steps"])):
            at = f"{where}: rank {rank['rank']} step {index}"
            check(step.get("index") == index, f"{at}: index {step.get('index')!r}")
            check(step.get("op") == spec["op"], f"{at}: op {step.get('op')!r}")
            if "module" in spec:
                check(step.get("module") == spec["module"], f"{at}: module {step.get('module')!r}")
            check(step.get("status") in STEP_STATUSES, f"{at}: status {step.get('status')!r}")
            check(isinstance(step.get("expected"), bool), f"{at}: expected {step.get('expected')!r}")
            check(isinstance(step.get("seconds"), (int, float)) and step["seconds"] >= 0,
                  f"{at}: seconds {step.get('seconds')!r}")
            check(isinstance(step.get("start_s"), (int, float)), f"{at}: start_s missing")
            if step["status"] in ("error", "hang"):
                error = step.get("error")
                check(isinstance(error, dict) and error.get("kind") in ERROR_KINDS
                      and isinstance(error.get("message"), str) and error["message"],
                      f"{at}: error {error!r}")
            else:
                check("error" not in step, f"{at}: error on a {step['status']} step")
            if "bind" in step:
                bind = step["bind"]
                check(spec["op"] == "forward", f"{at}: bind on a {spec['op']} step")
                check(isinstance(bind.get("binding_id"), int) and isinstance(bind.get("reused"), bool)
                      and isinstance(bind.get("seconds"), (int, float)), f"{at}: bind {bind!r}")
            if "label" in spec:
                check(step.get("label") == spec["label"], f"{at}: label {step.get('label')!r}")
        final = rank.get("final")
        check(isinstance(final, dict) and isinstance(final.get("groups"), int)
              and isinstance(final.get("bound_groups"), int)
              and isinstance(final.get("runtime_live"), bool), f"{where}: rank {rank['rank']} final {final!r}")
    check(isinstance(report.get("mismatches"), list), f"{where}: mismatches missing")
    for entry in report["mismatches"]:
        check({"step", "rank", "message", "diagnosis"} <= set(entry), f"{where}: mismatch entry {entry}")
    leaks = report.get("leaks")
    check(isinstance(leaks, dict) and isinstance(leaks.get("leaked"), bool)
          and len(leaks.get("ranks", [])) == world, f"{where}: leaks {leaks!r}")
    for entry in leaks["ranks"]:
        for key in ("rank", "checked", "groups", "bound_groups", "runtime_live", "bytes_held",
                    "workspaces_held", "held_by", "leaked"):
            check(key in entry, f"{where}: leaks rank entry lacks {key}")
    timings = report.get("timings")
    check(isinstance(timings, dict), f"{where}: timings missing")
    for key in TIMING_KEYS:
        check({"count", "p50", "p95", "max"} <= set(timings.get(key, {})), f"{where}: timings.{key}")
    check("hang" in report, f"{where}: hang missing")
    env = report.get("environment")
    check(isinstance(env, dict), f"{where}: environment missing")
    for key in ("hmc_version", "torch_version", "host", "transport", "world_size", "device",
                "timeout_s", "wall_seconds"):
        check(key in env, f"{where}: environment lacks {key}")


# ---- the checks -----------------------------------------------------------------------------

@functools.cache
def library_run():
    """One run of every library file (a report set; each hmc-run process loads LibTorch, about
    1 s of CPU, so not a process per file), made once per shard: (process, {file: report})."""
    files = library()
    report_path = os.path.join(WORK, "library.json")
    proc = run_cpu(*files, "--report", report_path, timeout=300)
    reports = load(report_path).get("reports", []) if os.path.exists(report_path) else []
    return proc, dict(zip(files, reports)) if len(reports) == len(files) else {}


def library_report(name):
    """The library run's report of scenarios/<name>.json."""
    proc, reports = library_run()
    path = os.path.join(SCENARIOS, name + ".json")
    check(path in reports, f"no report of {name} in the library run: {output(proc)}")
    return reports[path]


def test_every_library_scenario_passes_with_exit_0():
    files = library()
    proc, reports = library_run()
    check(proc.returncode == 0, output(proc))
    check(len(reports) == len(files), f"{len(reports)} reports for {len(files)} files")
    problems = []
    for path in files:
        name = os.path.basename(path)
        report = reports[path]
        try:
            check(report.get("outcome") == "pass", f"outcome {report.get('outcome')!r}")
            check_report(report, load(path), name)
        except (Failure, OSError, ValueError) as error:
            problems.append(f"{name}: {error}")
    check(not problems, "\n  ".join(problems))


def test_library_scenarios_are_described_and_small():
    names = set()
    for path in library():
        scenario = load(path)
        name = os.path.basename(path)
        check(scenario.get("description", "").strip(), f"{name}: no description")
        check(2 <= scenario.get("world_size", 1) <= 4, f"{name}: world_size {scenario.get('world_size')}")
        check(scenario.get("device", "auto") in ("auto", "cpu"), f"{name}: device {scenario.get('device')}")
        check(scenario["name"] not in names, f"{name}: duplicate name {scenario['name']}")
        names.add(scenario["name"])
        if any(s.get("expect") == "hang" for s in scenario["steps"]):
            check(scenario.get("timeout_s", 30) <= 5, f"{name}: a hang case with timeout_s {scenario.get('timeout_s')}")
    for required in ("quickstart", "reuse-churn", "fresh-churn"):
        check(os.path.exists(os.path.join(SCENARIOS, required + ".json")), f"{required}.json missing")


def test_directory_runs_every_scenario_into_a_report_set():
    report_path = os.path.join(WORK, "set.json")
    proc = run_cpu(library_directory(), "--report", report_path, timeout=300)
    check(proc.returncode == 0, output(proc))
    document = load(report_path)
    check(document.get("format") == "hmc-report-set/1", f"format {document.get('format')!r}")
    names = [load(p)["name"] for p in library()]
    check([r.get("scenario") for r in document["reports"]] == names,
          f"reports {[r.get('scenario') for r in document['reports']]}")
    check(all(r.get("outcome") == "pass" for r in document["reports"]), "a report did not pass")
    check("OK" in proc.stdout.splitlines()[-1], f"last line {proc.stdout.splitlines()[-1]!r}")


def test_failed_expectation_exits_1():
    for path in sorted(glob.glob(os.path.join(DATA, "fail", "*.json"))):
        report_path = os.path.join(WORK, "fail.json")
        proc = run_cpu(path, "--report", report_path)
        check(proc.returncode == 1, f"{os.path.basename(path)}: {output(proc)}")
        report = load(report_path)
        check(report["outcome"] == "fail", f"{os.path.basename(path)}: outcome {report['outcome']}")
        check(any(not s["expected"] for r in report["ranks"] for s in r["steps"]),
              f"{os.path.basename(path)}: no step marked expected false")
        check_report(report, load(path), os.path.basename(path))
    proc = run_cpu(os.path.join(DATA, "fail"))
    check(proc.returncode == 1, f"the fail directory: {output(proc)}")
    check("FAILED" in proc.stdout.splitlines()[-1], f"last line {proc.stdout.splitlines()[-1]!r}")


def test_invalid_input_exits_2():
    invalid = os.path.join(DATA, "invalid", "unknown-key.json")
    report_path = os.path.join(WORK, "invalid.json")
    proc = run_cpu(invalid, "--report", report_path)
    check(proc.returncode == 2, f"invalid scenario: {output(proc)}")
    check("/steps/0/featres" in proc.stderr, f"no JSON path on stderr: {output(proc)}")
    check("/steps/0/featres" not in proc.stdout and "FAILED" in proc.stdout,
          f"the error belongs on stderr, the closing line on stdout: {output(proc)}")
    report = load(report_path)
    check(report.get("outcome") == "invalid" and report.get("ranks") == [], f"report {report}")
    proc = run_cpu(os.path.join(SCENARIOS, "quickstart.json"), "--no-such-flag")
    check(proc.returncode == 2, f"unknown flag: {output(proc)}")
    proc = run_cpu(os.path.join(WORK, "missing.json"))
    check(proc.returncode == 2, f"missing file: {output(proc)}")
    empty = os.path.join(WORK, "empty-dir")
    os.makedirs(empty, exist_ok=True)
    proc = run_cpu(empty)
    check(proc.returncode == 2, f"empty directory: {output(proc)}")
    proc = run()
    check(proc.returncode == 2, f"no scenario: {output(proc)}")
    proc = run_cpu(os.path.join(SCENARIOS, "quickstart.json"), "--world-size", "0")
    check(proc.returncode == 2, f"--world-size 0: {output(proc)}")
    for bad in ("0", "-5", "nan", "2e6", "soon"):
        proc = run_cpu(os.path.join(SCENARIOS, "quickstart.json"), "--join-timeout", bad)
        check(proc.returncode == 2 and "--join-timeout" in proc.stderr and
              "expected a number of seconds > 0" in proc.stderr,
              f"--join-timeout {bad}: {output(proc)}")


def test_unexpected_hang_exits_3_with_a_diagnosis():
    path = os.path.join(DATA, "hang", "unexpected-hang.json")
    report_path = os.path.join(WORK, "hang.json")
    proc = run_cpu(path, "--report", report_path)
    check(proc.returncode == 3, output(proc))
    report = load(report_path)
    check(report["outcome"] == "hang", f"outcome {report['outcome']}")
    check(isinstance(report.get("hang"), dict) and "rank 1" in report["hang"].get("diagnosis", ""),
          f"hang {report.get('hang')}")
    check(report["ranks"][0]["steps"][2]["status"] == "hang", "rank 0 step 2 is not a hang")
    check_report(report, load(path), "unexpected-hang.json")


def test_collective_mismatch_is_named_in_the_report():
    path = os.path.join(SCENARIOS, "ranks-in-different-stages.json")
    report = library_report("ranks-in-different-stages")
    kinds = [s.get("error", {}).get("kind") for r in report["ranks"] for s in r["steps"]
             if s["index"] in (3, 4) and s["status"] == "error"]
    check(kinds == ["collective_mismatch", "collective_mismatch"], f"kinds {kinds} ({path})")
    report = library_report("divergent-manifest")
    check(report["mismatches"] and report["mismatches"][0]["diagnosis"].get("first_difference"),
          f"mismatches {report['mismatches']}")


def test_trace_has_a_process_per_rank_and_flow_events():
    path = os.path.join(SCENARIOS, "first-compatible-reused.json")
    trace_path = os.path.join(WORK, "trace.json")
    proc = run_cpu(path, "--trace", trace_path, "--quiet")
    check(proc.returncode == 0, output(proc))
    trace = load(trace_path)
    events = trace.get("traceEvents")
    check(isinstance(events, list) and events, "no traceEvents")
    world = load(path)["world_size"]
    processes = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    check(len(processes) == world, f"{len(processes)} process tracks for {world} ranks")
    slice_pids = {e["pid"] for e in events if e.get("ph") == "X"}
    check(slice_pids == processes, f"slices on pids {slice_pids}, processes {processes}")
    starts = [e for e in events if e.get("ph") == "s"]
    finishes = [e for e in events if e.get("ph") == "f"]
    check(starts and len(starts) == len(finishes), f"{len(starts)} flow starts, {len(finishes)} ends")
    check({e["id"] for e in starts} == {e["id"] for e in finishes}, "flow ids do not pair up")
    for event in events:
        check("ph" in event and "pid" in event, f"event without ph/pid: {event}")
        if event["ph"] in ("X", "s", "f", "i"):
            check(isinstance(event.get("ts"), (int, float)), f"event without ts: {event}")


def test_validate_subcommand():
    files = library()
    proc = run("validate", *files)
    check(proc.returncode == 0, output(proc))
    check(proc.stdout.count("ok ") >= len(files) and "OK" in proc.stdout.splitlines()[-1], output(proc))
    proc = run("validate", files[0], os.path.join(DATA, "invalid", "unknown-key.json"))
    check(proc.returncode == 2, f"validate with an invalid file: {output(proc)}")
    check("featres" in proc.stdout, output(proc))
    with_extension = os.path.join(WORK, "bad-extension.json")
    scenario = load(os.path.join(SCENARIOS, "quickstart.json"))
    scenario["reference_differs"] = {"why": "test", "steps": [99]}
    with open(with_extension, "w") as fh:
        json.dump(scenario, fh)
    proc = run("validate", with_extension)
    check(proc.returncode == 2 and "/reference_differs/steps/0" in proc.stdout, output(proc))


def test_list_subcommand():
    proc = run("list", SCENARIOS)
    check(proc.returncode == 0, output(proc))
    for path in library():
        scenario = load(path)
        check(scenario["name"] in proc.stdout, f"list lacks {scenario['name']}")
    proc = run("list", os.path.join(WORK, "no-such-dir"))
    check(proc.returncode == 2, f"list of a missing directory: {output(proc)}")


def test_process_transports_run_crash_and_hang_scenarios():
    """The library's crash and hang cases with ranks as real processes (tcp, store and gloo)."""
    names = ("quickstart", "crashed-rank", "skipped-close-hang")
    paths = [os.path.join(SCENARIOS, name + ".json") for name in names]
    for transport in ("tcp", "store", "gloo"):
        # One hmc-run per transport (fresh rank processes for each scenario all the same).
        report_path = os.path.join(WORK, f"process.{transport}.json")
        proc = run_cpu(*paths, "--transport", transport, "--report", report_path)
        check(proc.returncode == 0, f"{names} on {transport}: {output(proc)}")
        reports = load(report_path)["reports"]
        check(len(reports) == len(names), f"{len(reports)} reports on {transport}")
        for name, path, report in zip(names, paths, reports):
            check(report["outcome"] == "pass", f"{name} on {transport}: outcome {report['outcome']}")
            check(report["environment"]["transport"] == transport,
                  f"{name}: transport {report['environment']['transport']!r}")
            check_report(report, load(path), f"{name} on {transport}")


def _listening_sockets():
    """{inode: (address, port)} of every listening TCP socket of this host (/proc/net/tcp, tcp6)."""
    found = {}
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(name) as table:
                rows = table.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            # The kernel prints the address as 32-bit words in host (little-endian) order.
            raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, width, 8))
            found[fields[9]] = (ipaddress.ip_address(raw), int(port, 16))
    return found


def _socket_inodes(pids):
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except OSError:
            pass
    return inodes


def _process_tree(root):
    pids = {root}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == root:
            pids.add(int(entry))
    return pids


def test_local_run_listens_on_loopback_only():
    """A local run's store (and every other listener of its processes) is on loopback only:
    c10d binds every interface unless hmc confines it (issue 12, safe defaults)."""
    scenario = os.path.join(WORK, "listen-sleep.json")
    with open(scenario, "w") as f:
        json.dump({"format": "hmc-scenario/1", "name": "listen-sleep", "world_size": 2,
                   "steps": [{"op": "sleep", "seconds": 4},
                             {"op": "create", "module": "a", "type": "scratch_linear",
                              "features": 8},
                             {"op": "forward", "module": "a"},
                             {"op": "close", "module": "a"}]}, f)
    for transport in ("tcp", "store", "gloo"):
        proc = subprocess.Popen([HMC_RUN, scenario, "--device", "cpu", "--transport", transport,
                                 "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        seen = {}
        try:
            deadline = time.monotonic() + 60
            while proc.poll() is None and time.monotonic() < deadline:
                listening = _listening_sockets()
                for inode in _socket_inodes(_process_tree(proc.pid)):
                    if inode in listening:
                        seen[inode] = listening[inode]
                time.sleep(0.1)
            check(proc.poll() is not None, f"{transport}: still running after 60 s")
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        check(proc.returncode == 0, f"{transport}: exit {proc.returncode}\n{out}\n{err}")
        store_port = None
        for line in err.splitlines():
            if "store at 127.0.0.1:" in line:
                store_port = int(line.split("store at 127.0.0.1:")[1].split()[0])
        check(store_port is not None, f"{transport}: no store address in stderr:\n{err}")
        ports = {port for _, port in seen.values()}
        check(store_port in ports, f"{transport}: the store's port {store_port} was never seen "
                                   f"listening (seen: {sorted(seen.values(), key=str)})")
        for address, port in seen.values():
            loopback = address.is_loopback or (address.version == 6 and address.ipv4_mapped
                                               is not None and address.ipv4_mapped.is_loopback)
            check(loopback, f"{transport}: a rank process listens on {address} port {port}, "
                            "not on loopback")


def _limited(limit, soft, hard=None):
    """preexec_fn: sets one resource limit in the child before exec."""
    import resource

    def apply():
        resource.setrlimit(limit, (soft, soft if hard is None else hard))
    return apply


def _copies_for_another_user(work, scenario):
    """hmc-run, the runner next to it (hmc-run-torch: a scenario run execs it) and `scenario`
    copied into `work` for another user to run (hmc-run links no library of the build tree).
    Returns (hmc-run, scenario) there, or None with the reason printed."""
    runner = os.path.join(os.path.dirname(HMC_RUN), "hmc-run-torch")
    if not os.access(runner, os.X_OK):
        print(f"      (skipped: no runner hmc-run-torch next to {HMC_RUN} to copy for user "
              f"nobody, who may not reach the build folder)")
        return None
    folder = os.path.join(work, "bin")
    os.mkdir(folder)
    os.chmod(folder, 0o755)
    for binary in (HMC_RUN, runner):
        shutil.copy(binary, folder)
        os.chmod(os.path.join(folder, os.path.basename(binary)), 0o755)
    copy = shutil.copy(scenario, work)
    os.chmod(copy, 0o644)
    return os.path.join(folder, os.path.basename(HMC_RUN)), copy


def _sanitizer_runtime():
    """The sanitizer runtime hmc-run links (scripts/test --sanitize), or None."""
    proc = subprocess.run(["ldd", HMC_RUN], capture_output=True, text=True)
    for name in ("libasan", "libtsan"):
        if name in proc.stdout:
            return name
    return None


def _address_space_cases(limited):
    import resource
    three_gib = 3 << 30
    proc = limited(["--world-size", "2048"], _limited(resource.RLIMIT_AS, three_gib))
    check(proc.returncode == 2 and "ulimit -v" in proc.stderr and "thread stacks" in proc.stderr,
          f"address space 3 GiB, 2048 thread ranks: {output(proc)}")
    report_path = os.path.join(WORK, "no-threads.json")
    proc = limited(["--world-size", "2048", "--report", report_path],
                   _limited(resource.RLIMIT_AS, three_gib),
                   env=dict(os.environ, HMC_SKIP_PREFLIGHT="1"))
    check(proc.returncode == 1, f"2048 thread ranks without the preflight: {output(proc)}")
    report = load(report_path)
    crashed = [r for r in report["ranks"] if r.get("crashed")]
    check(crashed and all("could not start its thread" in r.get("crash_reason", "") and
                          "ulimit -v" in r["crash_reason"] for r in crashed),
          f"crashed ranks: {len(crashed)}, first {crashed[:1]}")


def test_preflight_refuses_what_the_host_cannot_run():
    """Exhaustion (issue 12): what a run needs is checked before any rank starts, the limit
    named; a soft open-file limit is raised; with the check skipped, a thread that cannot
    start is a crashed rank that names the limit, not an abort."""
    import resource
    quickstart = os.path.join(SCENARIOS, "quickstart.json")

    def limited(args, preexec, env=None, timeout=300):
        return subprocess.run([HMC_RUN, quickstart, "--device", "cpu", "--quiet", *args],
                              capture_output=True, text=True, timeout=timeout,
                              preexec_fn=preexec, env=env)

    proc = limited(["--transport", "tcp", "--world-size", "8"],
                   _limited(resource.RLIMIT_NOFILE, 64))
    check(proc.returncode == 2 and "ulimit -n" in proc.stderr and "open files" in proc.stderr,
          f"open-file hard limit 64: {output(proc)}")
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= 1024:
        proc = limited(["--transport", "tcp", "--world-size", "8"],
                       _limited(resource.RLIMIT_NOFILE, 64, hard))
        check(proc.returncode == 0 and "raised the open-file soft limit" in proc.stderr,
              f"open-file soft limit 64: {output(proc)}")
    else:
        print(f"      (skipped the soft-limit case: the hard open-file limit is {hard})")
    sanitizer = _sanitizer_runtime()
    if sanitizer:
        # Their shadow memory (terabytes of address space) cannot be mapped under ulimit -v.
        print(f"      (skipped the address-space cases: hmc-run links {sanitizer})")
    else:
        _address_space_cases(limited)
    with open("/proc/meminfo") as meminfo:
        available = next(int(line.split()[1]) * 1024 for line in meminfo
                         if line.startswith("MemAvailable:"))
    if available < 4096 * (64 << 20):
        proc = limited(["--transport", "tcp", "--world-size", "4096"], None)
        check(proc.returncode == 2 and "MemAvailable" in proc.stderr,
              f"4096 rank processes on {available >> 30} GiB: {output(proc)}")
    else:
        print(f"      (skipped the memory case: {available >> 30} GiB available)")


def test_task_limit_of_an_unprivileged_user():
    """Exhaustion (issue 12): the kernel holds only unprivileged users to RLIMIT_NPROC (ulimit
    -u). As root the run is made as user nobody (setuid in the child before exec), otherwise
    as this user. The preflight refuses a run the limit cannot hold, naming ulimit -u; with the
    preflight skipped, rank processes that cannot start a thread fail and say so (LibTorch's
    thread pool used to wait for its workers for good: every rank was killed after a minute
    with no reason given). Eight ranks starting together against the limit still race: one
    that took the last thread between hmc's check and LibTorch's pool can hang there until
    hmc-run kills it, so the case asks for a bounded run and the limit named, not for every
    rank to name it."""
    import pwd
    import resource
    root = os.geteuid() == 0
    work = tempfile.mkdtemp(prefix="hmc-e2e-nproc-")
    hmc_run, quickstart = HMC_RUN, os.path.join(SCENARIOS, "quickstart.json")
    try:
        if root:
            try:
                nobody = pwd.getpwnam("nobody")
            except KeyError:
                print("      (skipped: running as root and there is no user 'nobody' to run as)")
                return
            os.chown(work, nobody.pw_uid, nobody.pw_gid)
            # A clone under a folder only root can enter (mktemp -d) keeps its build folder
            # and scenarios out of nobody's reach: it runs copies in its own folder.
            copied = _copies_for_another_user(work, quickstart)
            if copied is None:
                return
            hmc_run, quickstart = copied

        def as_user(limit):
            def apply():
                if root:
                    os.setgroups([])
                    os.setgid(nobody.pw_gid)
                    os.setuid(nobody.pw_uid)
                _limited(resource.RLIMIT_NPROC, limit)()
            return apply

        def limited(args, limit, extra_env=None, timeout=180):
            env = dict(os.environ, TMPDIR=work, **(extra_env or {}))
            return subprocess.run([hmc_run, *args], capture_output=True, text=True, cwd=work,
                                  timeout=timeout, preexec_fn=as_user(limit), env=env)

        user = "nobody" if root else "this user"
        try:
            probe = limited(["--version"], 1000)
        except OSError as error:  # the exec or the chdir into `work`, refused in the child
            print(f"      (skipped: {hmc_run} does not start as {user} in {work}: {error})")
            return
        if probe.returncode != 0:
            print(f"      (skipped: {hmc_run} does not start as {user}: {output(probe)})")
            return
        args = [quickstart, "--device", "cpu", "--transport", "tcp", "--world-size", "8"]
        # Enough tasks for hmc-run itself, not for 8 rank processes (~20 tasks each).
        limit = 40
        proc = limited(args, limit)
        check(proc.returncode == 2 and "ulimit -u" in proc.stderr and
              "processes and threads" in proc.stderr,
              f"8 rank processes with ulimit -u {limit}: {output(proc)}")
        report_path = os.path.join(work, "report.json")
        start = time.monotonic()
        proc = limited([*args, "--report", report_path], 30, {"HMC_SKIP_PREFLIGHT": "1"})
        seconds = time.monotonic() - start
        check(proc.returncode == 1, f"ulimit -u 30 without the preflight: {output(proc)}")
        # Bounded: a rank that lost the race above is killed by hmc-run (about a minute).
        check(seconds < 150, f"ulimit -u 30 without the preflight took {seconds:.0f} s "
                             f"(deadline 10 s): {output(proc)}")
        check("ulimit -u" in proc.stderr, f"no rank named the thread limit: {output(proc)}")
        report = load(report_path)
        check(all(r.get("crashed") for r in report["ranks"]),
              f"ranks not reported crashed: {[r.get('crash_reason') for r in report['ranks']]}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_help_mentions_every_flag():
    proc = run("--help")
    check(proc.returncode == 0, output(proc))
    for flag in ("--world-size", "--transport", "--device", "--timeout", "--report", "--trace",
                 "--log-level", "--quiet", "validate", "list", "Exit codes", "Example"):
        check(flag in proc.stdout, f"--help does not mention {flag}")
    # The join deadline: its default, and that threads has no join.
    text = " ".join(proc.stdout.split())
    check(re.search(r"--join-timeout \S*SECONDS=300 ", text) is not None,
          f"--help does not show --join-timeout with its default 300:\n{proc.stdout}")
    check("threads transport forms no world" in text, "--help: --join-timeout and threads")


def main():
    if not HMC_RUN or not os.access(HMC_RUN, os.X_OK):
        print(f"usage: {sys.argv[0]} PATH/TO/hmc-run [REPO_ROOT] (got {HMC_RUN!r})")
        print("0 passed, 1 failed")
        return 1
    start = time.monotonic()
    for function in shard.pick((test_every_library_scenario_passes_with_exit_0,
                     test_library_scenarios_are_described_and_small,
                     test_directory_runs_every_scenario_into_a_report_set,
                     test_failed_expectation_exits_1,
                     test_invalid_input_exits_2,
                     test_unexpected_hang_exits_3_with_a_diagnosis,
                     test_collective_mismatch_is_named_in_the_report,
                     test_trace_has_a_process_per_rank_and_flow_events,
                     test_process_transports_run_crash_and_hang_scenarios,
                     test_local_run_listens_on_loopback_only,
                     test_preflight_refuses_what_the_host_cannot_run,
                     test_task_limit_of_an_unprivileged_user,
                     test_validate_subcommand,
                     test_list_subcommand,
                     test_help_mentions_every_flag), SHARD):
        test(function)
    shutil.rmtree(WORK, ignore_errors=True)
    print(f"# {time.monotonic() - start:.1f} s")
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
