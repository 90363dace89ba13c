#!/usr/bin/python3
"""The HTML pages of hmc-run as a user sees them, in headless Chromium (CTest labels e2e, html).

usage: test_html.py HMC_RUN [REPO_ROOT]

Runs the real hmc-run with --html on a passing scenario (quickstart), an expected hang
(skipped-close-hang), a crashed rank (crashed-rank), a run that fails (divergent-manifest
without its `expect`s: its first failure read first, its rank marked), draws a stored report with a
`leak_trends` section through `hmc-run render`, and compares two runs (`compare --html`,
`--format markdown`). Each page is loaded in Chromium (Debian's `chromium`, or $HMC_CHROMIUM;
one headless browser for the run, a tab a page, driven over the DevTools protocol on a pipe):
no script error and nothing on the console (Content Security Policy refusals included), the key
facts in the rendered DOM, and a screenshot (1400x1000) that is not blank: decoded here with zlib
and struct, it must have many colours and enough ink. Screenshots are kept in
$HMC_HTML_SCREENSHOTS when set; after a failure everything is kept in the temporary folder it
names.

Standard library only. Exit 77 (CTest: skipped) with the reason when no Chromium is found;
scripts/setup installs Debian's `chromium`. Prints one line per check and a closing
"N passed, N failed, N skipped"; exits 1 on any failure.
"""
import base64
import fcntl
import html
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import zlib

HMC_RUN = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None
REPO = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DATA = os.path.join(REPO, "tests", "e2e", "data", "render")
SCENARIOS = os.path.join(REPO, "scenarios")
WORK = tempfile.mkdtemp(prefix="hmc-html-")
SHOTS = os.environ.get("HMC_HTML_SCREENSHOTS") or WORK
SKIP_CODE = 77

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


class Failure(Exception):
    pass


def check(condition, message):
    if not condition:
        raise Failure(message)


def output(proc):
    return (f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-2000:]}\n--- stderr\n"
            f"{proc.stderr[-2000:]}")


def hmc_run(*args, timeout=120):
    return subprocess.run([HMC_RUN, *args], capture_output=True, text=True, timeout=timeout)


def find_chromium():
    for name in (os.environ.get("HMC_CHROMIUM"), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = None
BROWSER = None  # the one Chromium of the run (main())


class Browser:
    """One headless Chromium for every page, driven over the DevTools protocol on a pipe
    (--remote-debugging-pipe: it reads commands on its fd 3 and writes answers and events on its
    fd 4, each message JSON ended by a NUL). A Chromium start costs about 3.6 s of CPU (the
    machine's CPU counted while it ran, the quickstart page); with one start a page, this
    program took 42-46 s of the machine's CPU, with one browser 18.5-19.9 s."""

    def __init__(self):
        # --no-sandbox: Chromium refuses to run as root with its sandbox (CI containers are
        # root); a profile of our own so runs do not share state.
        self.profile = tempfile.mkdtemp(prefix="profile-", dir=WORK)
        self.log_path = os.path.join(WORK, "chromium.log")
        self.log = open(self.log_path, "wb")
        commands_read, self.commands = os.pipe()
        self.answers, answers_write = os.pipe()
        # The child's ends as fds 3 and 4: copied to high numbers first (a pipe's end may itself
        # be 3 or 4), then duplicated onto 3 and 4 between fork and exec. close_fds=False, since
        # it would close them after that; every other fd of this program is close-on-exec.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (commands_read, answers_write)]
        os.close(commands_read)
        os.close(answers_write)

        def onto_3_and_4():  # in the child, before exec
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             "--enable-logging=stderr", "--v=0", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log, close_fds=False,
            preexec_fn=onto_3_and_4)
        for fd in high:
            os.close(fd)
        self.buffer = b""
        self.next_id = 0
        self.events = []  # (sessionId, method, params) not yet taken
        self.call("Browser.getVersion", timeout=60)  # up and answering

    def why_gone(self):
        self.log.flush()
        with open(self.log_path, "rb") as fh:
            tail = fh.read()[-2000:].decode(errors="replace")
        return f"chromium's exit status {self.proc.poll()}; its log ({self.log_path}) ends:\n{tail}"

    def receive(self, deadline):
        """The next message from Chromium, waiting until `deadline` (time.monotonic())."""
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            check(left > 0, "chromium did not answer in time; " + self.why_gone())
            ready, _, _ = select.select([self.answers], [], [], left)
            if ready:
                chunk = os.read(self.answers, 1 << 20)
                check(chunk, "chromium closed its DevTools pipe; " + self.why_gone())
                self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def keep_event(self, message):
        """Keeps an event (a message with a method and no id) for wait_event and console."""
        if "method" in message:
            self.events.append((message.get("sessionId"), message["method"],
                                message.get("params", {})))

    def call(self, method, params=None, session=None, timeout=30):
        """Sends a command and returns its result; the events that arrive meanwhile are kept."""
        self.next_id += 1
        command = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            command["sessionId"] = session
        try:
            os.write(self.commands, json.dumps(command).encode() + b"\0")
        except OSError as error:
            raise Failure(f"chromium: cannot send {method} ({error}); " + self.why_gone())
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(deadline)
            if message.get("id") == self.next_id:
                check("error" not in message, f"chromium: {method} failed: {message.get('error')}")
                return message.get("result", {})
            self.keep_event(message)

    def wait_event(self, session, method, timeout=30):
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events:
                if event[0] == session and event[1] == method:
                    return
            self.keep_event(self.receive(deadline))

    def console(self, session):
        """What the page wrote on its console: console calls, uncaught exceptions, and the log's
        entries (Content Security Policy refusals among them). hmc's pages write nothing there, so
        each of them is an error."""
        lines = []
        for sid, method, params in self.events:
            if sid != session:
                continue
            if method == "Runtime.consoleAPICalled":
                words = [str(arg.get("value", arg.get("description", ""))) for arg in
                         params.get("args", [])]
                lines.append(f"console.{params.get('type')}: {' '.join(words)}")
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                lines.append("Uncaught " + details.get("exception", {}).get(
                    "description", details.get("text", "")))
            elif method == "Log.entryAdded":
                entry = params.get("entry", {})
                lines.append(f"{entry.get('source')} {entry.get('level')}: {entry.get('text')}")
        return lines

    def load(self, url, width=1400, height=1000):
        """(DOM, screenshot PNG bytes, console lines) of the page at `url` in a new tab of that
        size, once it has loaded and 2 s of virtual time have run (what --virtual-time-budget=2000
        gave the page's timers)."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget",
                            {"targetId": target, "flatten": True})["sessionId"]
        try:
            for method in ("Page.enable", "Runtime.enable", "Log.enable"):
                self.call(method, session=session)
            self.call("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1,
                       "mobile": False}, session)
            self.call("Page.navigate", {"url": url}, session)
            self.wait_event(session, "Page.loadEventFired")
            self.call("Emulation.setVirtualTimePolicy", {"policy": "advance", "budget": 2000},
                      session)
            self.wait_event(session, "Emulation.virtualTimeBudgetExpired")
            dom = self.call("Runtime.evaluate",
                            {"expression": "document.documentElement.outerHTML",
                             "returnByValue": True}, session)["result"]["value"]
            png = base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"},
                                             session)["data"])
            return dom, png, self.console(session)
        finally:
            self.call("Target.closeTarget", {"targetId": target})
            self.events = [event for event in self.events if event[0] != session]

    def close(self):
        try:
            self.call("Browser.close", timeout=10)
        except Failure:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.commands)
        os.close(self.answers)
        self.log.close()


# ---- PNG, decoded with the standard library -----------------------------------------------------

def png_pixels(path):
    """(width, height, bytes per pixel, rows of raw pixel bytes) of an 8-bit PNG."""
    with open(path, "rb") as fh:
        data = fh.read()
    check(data[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG")
    at, idat, header = 8, [], None
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        at += 12 + length
    width, height, depth, colour, _, _, interlace = header
    check(depth == 8 and colour in (2, 6) and interlace == 0,
          f"{path}: unexpected PNG (depth {depth}, colour type {colour}, interlace {interlace})")
    bpp = 4 if colour == 6 else 3
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    rows, previous = [], bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = previous[i]
                c = previous[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        previous = line
    return width, height, bpp, rows


def check_screenshot(path):
    """Not blank: many colours (status colours, text anti-aliasing) and some ink."""
    width, height, bpp, rows = png_pixels(path)
    colours, ink = set(), 0
    for row in rows[::2]:
        for x in range(0, width * bpp, bpp * 2):
            pixel = row[x:x + 3]
            colours.add(pixel)
            if pixel != b"\xff\xff\xff":
                ink += 1
    sampled = ((height + 1) // 2) * ((width + 1) // 2)
    check(len(colours) >= 32, f"{path}: only {len(colours)} distinct colours: a blank page?")
    check(ink / sampled > 0.02, f"{path}: {ink / sampled:.1%} of the pixels are not white")
    return len(colours), ink / sampled


# ---- a page in the browser ---------------------------------------------------------------------

def load(page, name):
    """The page's DOM as Chromium rendered it, after checking for errors and a screenshot."""
    url = "file://" + os.path.abspath(page)
    shot = os.path.join(SHOTS, f"{name}.png")
    if os.path.exists(shot):  # HMC_HTML_SCREENSHOTS may hold an earlier run's
        os.remove(shot)
    dom, png, console = BROWSER.load(url)
    with open(shot, "wb") as fh:
        fh.write(png)
    check("<main>" in dom and "</html>" in dom, f"{name}: no page in the DOM\n{dom[:500]}")
    check(not console, f"{name}: console errors:\n" + "\n".join(console[:10]))
    # The page's probe (an inline script) records script errors on <html>.
    recorded = re.search(r'<html[^>]*data-page-errors="([^"]*)"', dom)
    check("window.addEventListener('error'" in dom, f"{name}: the error probe is missing")
    check(recorded is None, f"{name}: a script error was recorded: {recorded and recorded[1]}")
    colours, ink = check_screenshot(shot)
    print(f"      {name}: screenshot {shot}: {colours} colours, {ink:.0%} ink", flush=True)
    return dom


def text_of(dom):
    """The visible text of a DOM dump, tags dropped, entities decoded, spaces squeezed."""
    dom = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", dom, flags=re.S)
    dom = re.sub(r"<title>.*?</title>", " ", dom, flags=re.S)  # tooltips are not shown
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", dom)))


def run_with_html(scenario, name, *extra, expect_exit=0):
    page = os.path.join(WORK, f"{name}.html")
    report = os.path.join(WORK, f"{name}.json")
    proc = hmc_run(os.path.join(SCENARIOS, scenario), "--html", page, "--report", report,
                   "--quiet", *extra)
    check(expect_exit is None or proc.returncode == expect_exit,
          f"hmc-run {scenario}: expected exit {expect_exit}\n{output(proc)}")
    check(os.path.exists(page), f"no page written at {page}")
    with open(report) as fh:
        return page, json.load(fh)


def cells(dom, status=None):
    return len(re.findall(r'class="cell s-' + (re.escape(status) if status else "") , dom))


# ---- the pages ---------------------------------------------------------------------------------

def pass_page():
    page, report = run_with_html("quickstart.json", "pass")
    dom = load(page, "pass")
    text = text_of(dom)
    check('data-outcome="pass"' in dom, "no pass section")
    check("Scenario quickstart pass" in text, text[:300])
    check("Every step on every rank met its expectation" in text, text[:600])
    steps = sum(len(r["steps"]) for r in report["ranks"])
    check(cells(dom) == steps, f"{cells(dom)} timeline cells for {steps} steps in the report")
    check(cells(dom, "ok") + cells(dom, "skipped") == steps, "a step that is not ok or skipped")
    check("fresh bind" in text and "reused bind" in text, "no bind distributions")
    fresh = sum(len(v) for v in report["samples"]["metrics"]["fresh_bind"]["per_repetition"])
    check(f"n={fresh} " in text, f"fresh binds: expected n={fresh}")
    check("Environment" in text and report["environment"]["host"] in text, "no environment")
    check(report["environment"]["transport"] + " transport" in text, "no transport")
    check("LibTorch " + report["environment"]["torch_version"] in text, "no torch version")
    check('id="hang"' not in dom and 'id="crash"' not in dom,
          "a pass page should say nothing of a hang or a crash")
    check(report["first_failure"] is None, f"a pass with a first failure: {report['first_failure']}")
    check("First failure" not in text and 'class="tag' not in dom,
          "a pass page should name no first failure")


def hang_page():
    page, report = run_with_html("skipped-close-hang.json", "hang")
    check(report["hang"] is not None, "the report has no hang section")
    dom = load(page, "hang")
    text = text_of(dom)
    # What a reader sees first: the stage, who waits, who is missing, before the timeline.
    check("Hang (expected by the scenario) in 'close validation' #1, step 2" in text, text[:600])
    check("Waiting: rank 0. Missing: rank 1 (never arrived)." in text, text[:600])
    check(text.index("Missing: rank 1") < text.index("Steps per rank"), "hang after the timeline")
    check(cells(dom, "hang") == 1, f"{cells(dom, 'hang')} hung cells")
    check("rank 1 never arrived at this step" in dom, "no missing-rank mark on rank 1's cell")
    check("stroke-dasharray=\"6 4\"" in dom, "the hung step's column is not marked")
    check("never arrived: last completed 'recycle' #0 (step 1)," in text, "no note at rank 1")
    # One story with the console ("not checked"): the shutdown never ran, so no rank is called
    # leaked, whatever it held when it stopped.
    check("Leaks not checked" in text and "2 ranks were not checked" in text, "no leaks section")
    check("left resources behind" not in text and "<strong>leaked</strong>" not in dom,
          "the hang page calls unchecked ranks leaked")


def first_failure_page():
    """divergent-manifest without its `expect`s: a run that fails, its first failure read first."""
    with open(os.path.join(SCENARIOS, "divergent-manifest.json")) as fh:
        scenario = json.load(fh)
    for step in scenario["steps"]:
        for key in [k for k in step if k.startswith("expect")]:
            del step[key]
    source = os.path.join(WORK, "divergent-unexpected.json")
    with open(source, "w") as fh:
        json.dump(scenario, fh)
    page, report = run_with_html(source, "first-failure", expect_exit=1)
    first = report["first_failure"]
    check(first is not None and first["kind"] == "manifest_mismatch",
          f"expected a manifest mismatch first: {first}")
    dom = load(page, "first-failure")
    text = text_of(dom)
    # Above everything else: the heading, the line, the rank it names and its host.
    check(text.index("First failure: manifest mismatch " + first["line"]) <
          text.index("Steps per rank"), "the first failure is not read first:\n" + text[:900])
    check(dom.index('id="r0-first-failure"') < dom.index('id="mismatches"'),
          "the mismatches' box comes before the first failure")
    named = first["ranks"]
    check(len(named) == 1, f"one rank named: {named}")
    check(f"named ranks rank {named[0]} the first failure host {first['hosts'][0]}" in text,
          "the named rank or its host is missing:\n" + text[:900])
    # Its timeline row is marked; the other rank's says it saw it.
    labels = {int(rank): part for part, rank in re.findall(
        r'<text class="rank-label part-(\w+)"[^>]*>rank (\d+)', dom)}
    check(labels.get(named[0]) == "cause", f"rank {named[0]}'s row is not marked: {labels}")
    for rank in first["seen_by"]:
        check(rank == named[0] or labels.get(rank) == "saw", f"rank {rank}: {labels}")
    for consequence in report["consequences"]:
        check(labels.get(consequence["rank"]) == "follows", f"{consequence}: {labels}")


def crash_page():
    page, report = run_with_html("crashed-rank.json", "crash", expect_exit=None)
    crashed = [r for r in report["ranks"] if r.get("crashed")]
    check(len(crashed) == 1, f"expected one crashed rank: {report['ranks']}")
    dom = load(page, "crash")
    text = text_of(dom)
    check("1 rank crashed" in text, text[:600])
    check(f"rank {crashed[0]['rank']}: {crashed[0]['crash_reason']}" in text,
          f"the crash reason {crashed[0]['crash_reason']!r} is not shown")
    check(f"data-outcome=\"{report['outcome']}\"" in dom, "outcome")
    check(cells(dom, "hang") >= 1, "rank 0's hung close_all is not drawn")


def leak_page():
    source = os.path.join(DATA, "leak-trends.json")
    page = os.path.join(WORK, "leak.html")
    proc = hmc_run("render", source, "--html", page)
    check(proc.returncode == 0, output(proc))
    with open(source) as fh:
        report = json.load(fh)
    dom = load(page, "leak")
    text = text_of(dom)
    trends = report["leak_trends"]
    check("Leak trends" in text, "no leak trends section")
    plots = re.findall(r'class="plot trend t-([a-z_]+)"', dom)
    check(len(plots) == len(trends["series"]), f"{len(plots)} trend plots")
    check(plots[0] == "leak", f"a leak should come first: {plots}")
    for series in trends["series"]:
        check(series["text"] in text, f"title {series['text']!r} missing")
    fitted = [t for t in trends["series"] if t["slope_per_cycle"] is not None]
    check(len(fitted) < len(trends["series"]), "the stored report should have a series without a fit")
    check(dom.count('class="fit"') == len(fitted), "a fitted line missing")
    check(dom.count('class="band"') == len(fitted), "a confidence band missing")
    # Read first: the leak, above the timeline.
    summary = "Leak: 1 series grows over the cycles " + trends["leaks"][0]
    check(summary in text, "the leak sentence is missing at the top")
    check(text.index(summary) < text.index("Steps per rank"), "the leak is not read first")
    # A document of another kind is refused.
    proc = hmc_run("render", os.path.join(REPO, "scenarios", "quickstart.json"), "--html",
                   os.path.join(WORK, "x.html"))
    check(proc.returncode == 2 and "unknown format 'hmc-scenario/1'" in proc.stderr, output(proc))


def real_leak_page():
    """A run that leaks a descriptor each cycle: the page of hmc-run itself, not a stored one."""
    scenario = os.path.join(WORK, "leaking.json")
    with open(scenario, "w") as fh:
        json.dump({"format": "hmc-scenario/1", "name": "leaking", "world_size": 2,
                   "device": "cpu", "timeout_s": 20, "steps": [
                       {"op": "create", "module": "a", "features": 16},
                       {"op": "forward", "module": "a", "batch": 2},
                       {"op": "close_all"},
                       {"op": "fault", "kind": "leak", "resource": "descriptor"}]}, fh)
    page, report = run_with_html(scenario, "real-leak", "--repetitions", "30", expect_exit=1)
    trends = report["leak_trends"]
    check(trends["leaks"], f"the run found no leak: {trends}")
    dom = load(page, "real-leak")
    text = text_of(dom)
    plots = re.findall(r'class="plot trend t-([a-z_]+)"', dom)
    check(plots and plots[0] == "leak", f"the leak's plot should come first: {plots}")
    check(trends["leaks"][0] in text, f"{trends['leaks'][0]!r} is not on the page")
    fitted = [t for t in trends["series"] if t["slope_per_cycle"] is not None]
    check(dom.count('class="fit"') == len(fitted), "a fitted line missing")
    check("Every step met its expectation; the leak trend failed the run" in text,
          "the page does not say that the leak failed the run")


def compare_page():
    reports = []
    for name in ("base", "again"):
        report = os.path.join(WORK, f"{name}-reps.json")
        proc = hmc_run(os.path.join(SCENARIOS, "quickstart.json"), "--repetitions", "6",
                       "--report", report, "--quiet")
        check(proc.returncode == 0, output(proc))
        reports.append(report)
    page = os.path.join(WORK, "compare.html")
    # A wide gate: two runs of one scenario on a loaded machine must not fail it; the page is
    # the point here.
    proc = hmc_run("compare", *reports, "--html", page, "--max-regression", "1000%")
    check(proc.returncode in (0, 1), output(proc))
    doc = json.loads(hmc_run("compare", *reports, "--json", "--max-regression", "1000%").stdout)
    verdict = ("FAILED" if proc.returncode == 1 else
               "INCONCLUSIVE" if doc["inconclusive"] else "OK")
    dom = load(page, "compare")
    text = text_of(dom)
    check(f'data-verdict="{verdict}"' in dom, f"verdict {verdict} not on the page")
    check(text.count("baseline candidate") >= 1, "no baseline/candidate rows")
    plots = re.findall(r'class="plot metric v-([a-z]+)"', dom)
    check(len(plots) == len(doc["metrics"]), f"{len(plots)} plots for {len(doc['metrics'])} metrics")
    for metric in doc["metrics"]:
        check(metric["name"] in text, f"{metric['name']} missing")
        check(len(metric["baseline"]["values"]) == metric["baseline"]["samples"],
              f"--json values of {metric['name']}")
    dots = dom.count("<circle")
    samples = sum(m["baseline"]["samples"] + m["current"]["samples"] for m in doc["metrics"])
    check(dots == samples, f"{dots} dots for {samples} samples")
    # The same page later, from compare's --json alone (a CI artefact).
    saved = os.path.join(WORK, "compare.json")
    with open(saved, "w") as fh:
        json.dump(doc, fh)
    later = os.path.join(WORK, "compare-later.html")
    proc = hmc_run("render", saved, "--html", later)
    check(proc.returncode == 0, output(proc))
    with open(page) as fh, open(later) as gh:
        check(fh.read() == gh.read(), "render of compare --json differs from compare --html")
    # The Markdown summary of the same comparison.
    proc = hmc_run("compare", *reports, "--format", "markdown", "--max-regression", "1000%")
    check(proc.returncode == (1 if verdict == "FAILED" else 0), output(proc))
    lines = proc.stdout.splitlines()
    check(lines[0] == f"### hmc-run compare: {verdict}", proc.stdout[:300])
    check("| metric | baseline | candidate | change | interval | p | verdict |" in lines,
          proc.stdout[:600])
    rows = [l for l in lines if l.startswith("| ") and not l.startswith("| metric")]
    check(len(rows) == len(doc["metrics"]), f"{len(rows)} rows\n{proc.stdout}")
    check(lines[-1].startswith(f"**{verdict}**: "), lines[-1])
    check("# OK" not in proc.stdout and "# FAILED" not in proc.stdout,
          "the console's verdict line belongs on stderr with --format markdown")


def output_paths_checked_like_report():
    scenario = os.path.join(SCENARIOS, "quickstart.json")
    missing = os.path.join(WORK, "no-such-folder", "page.html")
    for flag in ("--report", "--html"):
        proc = hmc_run(scenario, flag, missing)
        check(proc.returncode == 2, output(proc))
        check(f"cannot write {missing}: the folder" in proc.stderr, output(proc))
    proc = hmc_run(scenario, "--report", "-", "--html", "-")
    check(proc.returncode == 2 and "--report - and --html - would both write to standard output"
          in proc.stderr, output(proc))
    proc = hmc_run("compare", os.path.join(REPO, "tests", "e2e", "data", "compare", "baseline.json"),
                   os.path.join(REPO, "tests", "e2e", "data", "compare", "same.json"), "--html", missing)
    check(proc.returncode == 2 and f"cannot write {missing}: the folder" in proc.stderr, output(proc))
    proc = hmc_run("compare", "a.json", "b.json", "--json", "--format", "markdown")
    check(proc.returncode == 2 and "--json and --format markdown" in proc.stderr, output(proc))


def the_checks_catch_a_broken_page():
    """The checks above can fail: a script error, a console error, a script refused by the
    page's Content Security Policy and a blank page are caught."""
    probe = ("<script>window.addEventListener('error',function(e){var d=document.documentElement;"
             "d.setAttribute('data-page-errors',(d.getAttribute('data-page-errors')||'')+e.message"
             "+';')});</script>")
    pages = {
        "thrown": f"<!DOCTYPE html><html><head>{probe}</head><body><main>x</main>"
                  "<script>throw new Error('boom')</script></body></html>",
        "console": f"<!DOCTYPE html><html><head>{probe}</head><body><main>x</main>"
                   "<script>console.error('bad thing')</script></body></html>",
        "blank": f"<!DOCTYPE html><html><head>{probe}</head><body><main></main></body></html>",
        "csp": "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" "
               f"content=\"script-src 'none'\">{probe}</head><body><main>x</main></body></html>",
    }
    for name, text in pages.items():
        page = os.path.join(WORK, f"broken-{name}.html")
        with open(page, "w") as fh:
            fh.write(text)
        try:
            load(page, f"broken-{name}")
        except Failure as caught:
            expected = {"thrown": "boom", "console": "bad thing", "blank": "distinct colours",
                        "csp": "Content Security Policy"}[name]
            check(expected in str(caught), f"broken-{name}: caught for another reason: {caught}")
            continue
        raise Failure(f"broken-{name}: the checks passed a broken page")


def test(function):
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


def main():
    global CHROMIUM, BROWSER
    if HMC_RUN is None or not os.path.exists(HMC_RUN):
        print(__doc__)
        return 2
    CHROMIUM = find_chromium()
    if CHROMIUM is None:
        print("skip: no Chromium found (chromium, chromium-browser, google-chrome or "
              "$HMC_CHROMIUM); scripts/setup installs Debian's chromium", flush=True)
        return SKIP_CODE
    try:
        BROWSER = Browser()
    except Failure as failure:
        print(f"FAIL  starting chromium: {failure}", flush=True)
        return 1
    try:
        for function in (the_checks_catch_a_broken_page, pass_page, hang_page, crash_page,
                         first_failure_page, leak_page, real_leak_page, compare_page,
                         output_paths_checked_like_report):
            test(function)
    finally:
        BROWSER.close()
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed, "
          f"{RESULTS['skipped']} skipped")
    if RESULTS["failed"] == 0:
        shutil.rmtree(WORK, ignore_errors=True)  # kept after a failure, to look at
    else:
        print(f"# pages, reports and screenshots kept in {WORK}", flush=True)
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
