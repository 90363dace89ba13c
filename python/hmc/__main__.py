"""python3 -m hmc [-m MODULE | PROGRAM.py] [ARGS...]: runs a program on the reference with hmc's
hooks, unchanged (as python3 -m cProfile runs one under the profiler)."""

import os
import runpy
import sys

from . import reference

USAGE = """usage: python3 -m hmc [--check] [-m MODULE | PROGRAM.py] [ARGS...]

Runs a Python program on the reference (hyper_multicore) with hmc's hooks, unchanged: every
exchange tagged with its stage and sequence, this rank's heartbeat in the job's store (attach
with `hmc-run status --master-addr A --master-port P`), and at the deadline the waiting ranks
say who waits where and who never came. Under a launcher:

  torchrun --nproc_per_node 4 -m hmc train.py ARGS
  srun python3 -m hmc train.py ARGS

  --check    import the reference (hyper_multicore) and check that every name the hooks
             need is there; exit 0 if so, 1 naming the missing ones

Environment: HMC_TIMEOUT (seconds a rank may wait in one exchange, default 30), HMC_ON_HANG
(report: print and wait on, the default; abort: print, then end the rank with exit status 3),
HMC_RUN (the hmc-run binary that prints the job's status at the deadline; default: on PATH,
else this repository's build/app/hmc-run). docs/python.md has the details."""


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    if argv[0] == "--check":
        reference.attach()
        try:
            import hyper_multicore.modules.module  # noqa: F401
        except ImportError as error:
            print(f"# hmc: {error}", file=sys.stderr)
            return 1
        print(f"# hmc: hooked {', '.join(reference.hooked())}")
        return 0
    reference.attach()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("# hmc: -m needs a module name (python3 -m hmc -m MODULE [ARGS...])",
                  file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return 0
    program = argv[0]
    if not os.path.isfile(program):
        print(f"# hmc: no program '{program}' (python3 -m hmc PROGRAM.py [ARGS...])",
              file=sys.stderr)
        return 2
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(program))
    runpy.run_path(program, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
