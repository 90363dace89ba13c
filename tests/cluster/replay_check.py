"""A recording brought back to one machine (docs/record-replay.md): the check the cluster tests
share after the embedding example's skipped close across hosts. Python 3 standard library."""

import re
import subprocess


def check_replay(hmc_run, text, recorded, merged, missing):
    """Rank 0's report (`text`) said it hung in 'close validation' #N. The ranks' recordings in
    the folder `recorded`, merged into `merged` and replayed by `hmc_run` on thread ranks, must
    hang in that collective with rank `missing` missing: timed out waiting for it (it worked
    alone past the deadline: a sleep in the replay), or it crashed there (the launcher's
    teardown killed it: its recording stops). Returns the replay (CompletedProcess)."""
    waited = re.search(r"^  rank 0 \(\S+\): hang in 'close validation' #(\d+)", text, re.M)
    assert waited, f"rank 0's report does not say it hung in 'close validation'\n{text}"
    done = subprocess.run([hmc_run, "record", "merge", recorded, "-o", merged],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done
    replay = subprocess.run([hmc_run, merged], capture_output=True, text=True, timeout=120)
    assert replay.returncode == 3, replay
    sequence = waited.group(1)
    assert f"# hang: rank 0 waits in 'close validation' #{sequence} " in replay.stdout, replay
    assert re.search(rf"'close validation' #{sequence} timed out on rank 0 after [\d.]+ s: ranks "
                     rf"\[{missing}\] did not arrive|rank {missing} was announced dead in 'close validation' "
                     rf"#{sequence}: ", replay.stdout), replay
    return replay
