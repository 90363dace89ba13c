"""The case loop of hmc's Python end-to-end tests (standard library only).

    from cases import Skip, run_cases
    sys.exit(run_cases([("name", fn), ...], only=ONLY, cleanup=lambda: shutil.rmtree(TMP)))

Runs each case whose name contains `only` (all without it) and prints one line per case:
"PASS name (1.2 s)", "SKIP name: why" (the case raised Skip: a tool it needs is missing), or
"FAIL name (1.2 s)" and the traceback; then "N passed, N failed, N skipped in S s". `cleanup`
runs after the last case, failed or not. Returns the exit code: 1 when a case failed or none
was selected (a -k that matches nothing is an error, not a pass), 77 (CTest's
SKIP_RETURN_CODE: the test shows as skipped, not passed, since not everything was checked) when
a case was skipped and none failed, else 0.
"""
import time
import traceback


class Skip(Exception):
    """A case that cannot run here; the message says why."""


def run_cases(cases, only=None, cleanup=None):
    passed = failed = skipped = 0
    began_all = time.monotonic()
    try:
        for name, case in cases:
            if only and only not in name:
                continue
            began = time.monotonic()
            try:
                case()
                passed += 1
                print(f"PASS {name} ({time.monotonic() - began:.1f} s)", flush=True)
            except Skip as why:
                skipped += 1
                print(f"SKIP {name}: {why}", flush=True)
            except Exception:  # noqa: BLE001 - every case runs, every failure is printed
                failed += 1
                print(f"FAIL {name} ({time.monotonic() - began:.1f} s)", flush=True)
                traceback.print_exc()
    finally:
        if cleanup:
            cleanup()
    print(f"{passed} passed, {failed} failed, {skipped} skipped "
          f"in {time.monotonic() - began_all:.1f} s", flush=True)
    if passed + failed + skipped == 0:
        print(f"FAIL: no case matches -k {only}")
        return 1
    if failed:
        return 1
    return 77 if skipped else 0
