"""A master port for tests that start hmc-run's ranks themselves (launcher variables simulated,
one process per rank). Standard library only.

    from ports import free_port, on_a_free_port
    results = on_a_free_port(lambda port: start_ranks(port), host="127.0.0.2")
"""

import socket


def free_port(host="127.0.0.1"):
    """A port that nothing listens on at `host` now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def on_a_free_port(launch, host="127.0.0.1", attempts=3):
    """Runs launch(port) on a free_port(host) and returns what it returns: [(exit, stdout,
    stderr)] per rank, rank 0 first.

    free_port's port is free only until its socket closes: another test's store (a wildcard
    listener on an ephemeral port) may take it before rank 0 binds it. Rank 0 then names the
    taken port and exits, and the other ranks wait out their join deadline (so `launch` gives
    them a short one, for their own message to show inside its bound). That race alone, rank
    0's taken-port message for this port and nothing else, earns another port."""
    for _ in range(attempts):
        port = free_port(host)
        results = launch(port)
        if results[0][0] == 0 or f"port {port} is already in use" not in results[0][2]:
            return results
        print(f"note: port {port} on {host} was taken before rank 0 bound it; another port",
              flush=True)
    return results
