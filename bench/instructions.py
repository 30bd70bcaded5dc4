"""User-space instructions per `POST /assign`, counted by valgrind's callgrind, for one or
more builds of the service: a per-request cost that repeats to within a fraction of a
percent however busy the machine is, where requests per second on a shared machine do not.

    python3 bench/instructions.py BINARY [BINARY ...]

Each binary runs on the embedded store under callgrind twice, answering FEW and then MANY
assigns sent one after another on one keep-alive connection; the difference of the two
totals divided by MANY - FEW is the cost of one assign, start-up and shutdown excluded.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile

import assign as bench

FEW, MANY = 1000, 6000
ASSIGN = b"POST /pools/p/assign HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"


def read_answer(sock, pending):
    while b"\r\n\r\n" not in pending:
        pending += sock.recv(65536)
    head, rest = pending.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"content-length: (\d+)", head, re.I).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head, rest[length:]


def instructions(binary, assigns):
    port = bench.free_port()
    out = tempfile.NamedTemporaryFile(suffix=".callgrind", delete=False).name
    env = dict(os.environ, ADMIN_TOKEN=bench.TOKEN, LISTEN_ADDR=f"127.0.0.1:{port}",
               LOG_FORMAT="json", RUST_LOG="warn")
    for name in ["REDIS_URL", "REDIS_CLUSTER_URLS", "REDIS_SENTINEL_URLS"]:
        env.pop(name, None)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bench.wait_port(port, timeout=120)
        base = f"http://127.0.0.1:{port}"
        bench.request(base, "PUT", "/pools/p", {})
        bench.request(base, "POST", "/pools/p/members",
                      {"members": [f"proxy-{i:03d}" for i in range(100)]})
        with socket.create_connection(("127.0.0.1", port)) as sock:
            pending = b""
            for _ in range(assigns):
                sock.sendall(ASSIGN)
                head, pending = read_answer(sock, pending)
                assert head.startswith(b"HTTP/1.1 200"), head
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    with open(out) as data:
        total = next(int(line.split()[1]) for line in data
                     if line.startswith(("summary:", "totals:")))
    os.unlink(out)
    return total


def main():
    results = []
    for binary in sys.argv[1:]:
        per_assign = (instructions(binary, MANY) - instructions(binary, FEW)) / (MANY - FEW)
        results.append(per_assign)
        print(f"{per_assign:10,.0f} instructions per assign  {binary}", flush=True)
    if len(results) > 1:
        print(f"ratio to the first: " + ", ".join(f"{r / results[0]:.4f}" for r in results[1:]))


if __name__ == "__main__":
    main()
