"""A master port for tests that start ranks, stores or launchers themselves and give them the
port. Standard library only.

    from ports import reserved_port, on_a_free_port
    port = reserved_port()   # held until this test program ends
    results = on_a_free_port(lambda port: start_ranks(port), host="127.0.0.2")

A port found by binding port 0 and closing the socket is free only until it closes: any other
test's bind to port 0 or outgoing connection may take it before the store binds it (seen in
CI: rank 0 could not host its store, and the other ranks waited out their join deadline). The
port is held instead, as hmc-run's own launcher holds the ports it picks
(collective::PortReservation): a socket bound to it with SO_REUSEADDR, not listening, which
the kernel's choices skip and which c10d's TCPStore (SO_REUSEADDR too) binds over.
"""

import socket

_held = []  # the reservations, open until the test program ends


def reserved_port(host="127.0.0.1"):
    """A port of `host` that no other bind to port 0 or connection gets while this program
    runs, and that a store started on it (SO_REUSEADDR) can bind. Not inherited by children
    (Python's sockets are not inheritable)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, 0))
    _held.append(s)
    return s.getsockname()[1]


def on_a_free_port(launch, host="127.0.0.1", attempts=3):
    """Runs launch(port) on a reserved_port(host) and returns what it returns: [(exit, stdout,
    stderr)] per rank, rank 0 first.

    The port is held (reserved_port). Should rank 0 still find it taken, it names the port
    and exits, and the other ranks wait out their join deadline (so `launch` gives them a short
    one, for their own message to show inside its bound): that alone, rank 0's taken-port
    message for this port and nothing else, earns another port."""
    for _ in range(attempts):
        port = reserved_port(host)
        results = launch(port)
        if results[0][0] == 0 or f"port {port} is already in use" not in results[0][2]:
            return results
        print(f"note: port {port} on {host} was taken before rank 0 bound it; another port",
              flush=True)
    return results
