"""Whether a Python has torchrun (Debian's python3-torch), asked without importing torch.

    from torch_probe import torchrun_missing
    why = torchrun_missing("/usr/bin/python3")
    if why:
        raise Skip(why)

`import torch.distributed.run` costs about 1.8 s of CPU on the 2-core machine (LibTorch's
shared libraries and static initialisers), and the tests asked it once per case, 13 times a
suite. Here the interpreter only looks the package up (importlib's find_spec runs none of its
code) and checks that torch/distributed/run.py is there: about 0.03 s. An install
that is there but broken is not skipped: the launcher's own run fails, and the test with it.
Asked once per interpreter per test program.
"""
import functools
import subprocess

_ASK = ("import importlib.util, os, sys\n"
        "spec = importlib.util.find_spec('torch')\n"
        "places = list(spec.submodule_search_locations or []) if spec else []\n"
        "sys.exit(0 if any(os.path.isfile(os.path.join(p, 'distributed', 'run.py'))\n"
        "                  for p in places) else 1)\n")


@functools.lru_cache(maxsize=None)
def torchrun_missing(python="/usr/bin/python3"):
    """None when `python` has torch.distributed.run, else a sentence saying why not."""
    try:
        proc = subprocess.run([python, "-c", _ASK], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"torchrun: {python} could not be asked for torch ({error})"
    if proc.returncode != 0:
        return (f"torchrun: {python} has no torch.distributed.run (Debian's python3-torch; "
                f"scripts/setup installs it){': ' + proc.stderr.strip() if proc.stderr else ''}")
    return None
