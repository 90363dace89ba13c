"""`--shard K/N` for the long Python tests: CTest runs each shard as a test of its own, so that
the cases of one program that mostly wait on deadlines run beside each other instead of one
after the other. Shard K of N takes the cases whose index i (in the program's own order, after
its other filters) has i % N == K - 1; every case is in exactly one shard. Standard library only.
"""

import sys


def parse(argv):
    """(K, N) from `--shard K/N` in argv, (1, 1) without it; exits 2 on a malformed value."""
    if "--shard" not in argv:
        return 1, 1
    at = argv.index("--shard")
    value = argv[at + 1] if at + 1 < len(argv) else ""
    try:
        k, n = (int(part) for part in value.split("/"))
    except ValueError:
        k, n = 0, 0
    if not 1 <= k <= n:
        print(f"{argv[0]}: --shard takes K/N with 1 <= K <= N (for example 2/3), not {value!r}",
              file=sys.stderr)
        sys.exit(2)
    return k, n


def pick(items, shard):
    """The items of `shard` (K, N): every N-th, from the K-th."""
    k, n = shard
    return [item for i, item in enumerate(items) if i % n == k - 1]


def describe(shard):
    """' (shard K/N)' for the program's opening line, '' without sharding."""
    return "" if shard == (1, 1) else f" (shard {shard[0]}/{shard[1]})"
