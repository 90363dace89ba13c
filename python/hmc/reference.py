"""Hooks into the reference (hyper_multicore), whichever one the program imports: its manager's
and module base's entry points, and each collective exchange with its stage and sequence.

    import hmc.reference
    hmc.reference.attach()     # before or after the program imports hyper_multicore

The hooks wrap; they change no result and no error of the reference. Where a name they need is
missing (another version of the reference), attach() or the import fails naming it.
"""

import atexit
import importlib.abc
import sys
import threading

from ._flight import FLIGHT

AUTOMATIC = "hyper_multicore._automatic"
MODULE = "hyper_multicore.modules.module"

# The names the hooks rely on, by module: a reference without one of them is not one these
# hooks understand.
REQUIRED = {
    AUTOMATIC: ["exchange", "collective_call"],
    MODULE: ["_MulticoreResourceManager", "_MulticoreResourceManager.recycle",
             "_MulticoreResourceManager._validate_collective_close",
             "_MulticoreResourceManager.close_groups", "MulticoreModule",
             "MulticoreModule._get_execution_resources", "MulticoreModule.close",
             "MulticoreModule.share_execution_resources"],
}

_lock = threading.Lock()
_attached = False
_patched = set()
_watcher = None


class ReferenceMismatch(ImportError):
    """The reference the program imports lacks a name the hooks need."""


def missing_names(module_name, module):
    missing = []
    for dotted in REQUIRED[module_name]:
        target = module
        for part in dotted.split("."):
            target = getattr(target, part, None)
            if target is None:
                break
        if target is None:
            missing.append(f"{module_name}.{dotted}")
    return missing


def _failure_status(error):
    text = str(error)
    if "Connection closed by peer" in text or "Connection reset" in text:
        return "rank_failure"
    if "Timed out" in text or "timed out" in text or "timeout" in text.lower():
        return "timeout"
    return "error"


def _start_watcher():
    """Once the process group exists: heartbeats and the deadline (hmc/_watch.py)."""
    global _watcher
    if _watcher is not None:
        return
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return
    from ._watch import Watcher
    with _lock:
        if _watcher is not None:
            return
        _watcher = Watcher(dist.get_rank(), dist.get_world_size(), str(dist.get_backend()))
    _watcher.start()
    atexit.register(_watcher.stop)


def _patch_automatic(automatic):
    exchange = automatic.exchange
    collective_call = automatic.collective_call

    def hmc_exchange(value):
        _start_watcher()
        entry = FLIGHT.enter()
        try:
            peers = exchange(value)
        except BaseException as error:
            FLIGHT.leave(entry, _failure_status(error))
            FLIGHT.note_failure(error)
            raise
        FLIGHT.leave(entry, "ok")
        return peers

    def hmc_collective_call(fn, stage):
        previous = FLIGHT.push_stage(stage)
        try:
            return collective_call(fn, stage)
        except BaseException as error:
            FLIGHT.note_failure(error)
            raise
        finally:
            FLIGHT.pop_stage(previous)

    hmc_exchange.__wrapped__ = exchange
    hmc_collective_call.__wrapped__ = collective_call
    automatic.exchange = hmc_exchange
    automatic.collective_call = hmc_collective_call


def _staged(method, stage):
    def hooked(*args, **kwargs):
        previous = FLIGHT.push_stage(stage) if stage else None
        try:
            return method(*args, **kwargs)
        except BaseException as error:
            FLIGHT.note_failure(error)
            raise
        finally:
            if stage:
                FLIGHT.pop_stage(previous)
    hooked.__wrapped__ = method
    hooked.__name__ = getattr(method, "__name__", "hooked")
    return hooked


def _patch_module(module):
    manager = module._MulticoreResourceManager
    manager.recycle = _staged(manager.recycle, "recycle")
    manager._validate_collective_close = _staged(manager._validate_collective_close,
                                                 "close validation")
    manager.close_groups = _staged(manager.close_groups, None)
    base = module.MulticoreModule
    base._get_execution_resources = _staged(base._get_execution_resources, None)
    base.close = _staged(base.close, None)
    share = base.share_execution_resources.__func__
    base.share_execution_resources = classmethod(_staged(share, None))


def _patch(name, module):
    with _lock:
        if name in _patched:
            return
        missing = missing_names(name, module)
        if missing:
            raise ReferenceMismatch(
                f"hmc: the reference at {getattr(module, '__file__', name)} lacks "
                f"{', '.join(missing)}: these hooks follow ../shared/oracle/hyper_multicore; "
                "run the program without hmc, or with the reference they follow")
        (_patch_automatic if name == AUTOMATIC else _patch_module)(module)
        _patched.add(name)


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, name):
        self.loader = loader
        self.name = name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch(self.name, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches the reference's modules as they are imported."""

    def find_spec(self, name, path, target=None):
        if name not in REQUIRED or name in _patched:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, name)
                return spec
        return None


def attach():
    """Hooks the reference: the modules already imported now, the others when imported."""
    global _attached
    with _lock:
        if not _attached:
            sys.meta_path.insert(0, _Finder())
            _attached = True
    for name in REQUIRED:
        if name in sys.modules:
            _patch(name, sys.modules[name])


def hooked():
    """The reference's modules hooked so far (for tests and `python3 -m hmc --check`)."""
    return sorted(_patched)
