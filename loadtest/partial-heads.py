#!/usr/bin/env python3
"""Many connections each holding a request head but for its end.

Starts the proxy (label mode, its upstream a closed port: no request is
ever forwarded) with the binary's defaults, opens CONNECTIONS connections
without credentials, sends each a request head of about 60 KB (95 fields,
under the default limits.max_header_bytes of 64 KiB and its 100 fields)
but for the blank line that ends it, and prints the proxy's RSS before and
while they are held. No credential is needed: a head is read before any.

    python3 loadtest/partial-heads.py PROXY_BINARY [CONNECTIONS]   # 1000

Loopback only; every port is a free one; the proxy is killed at the end.
Raise the shell's open-file limit (ulimit -n) above CONNECTIONS first.
"""
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

FIELDS = 95
FIELD_VALUE_BYTES = 620
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    binary = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    work = tempfile.mkdtemp()
    port, admin, closed = free_port(), free_port(), free_port()
    with open(os.path.join(REPO, "examples/proxy/tenants.yaml")) as src:
        tenants = src.read()
    with open(f"{work}/tenants.yaml", "w") as out:
        out.write(tenants)
    with open(f"{work}/config.yaml", "w") as out:
        out.write(
            f"listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\n"
            f"tenants_file: tenants.yaml\nmetrics:\n"
            f"  upstream: http://127.0.0.1:{closed}\n  mode: label\n"
        )
    proxy = subprocess.Popen(
        [binary, "--config", f"{work}/config.yaml"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def rss_mib():
        with open(f"/proc/{proxy.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024

    connections = []
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{admin}/readyz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        head = b"GET /api/v1/query?query=up HTTP/1.1\r\nhost: proxy\r\n" + b"".join(
            b"x-pad-%d: %s\r\n" % (i, b"a" * FIELD_VALUE_BYTES) for i in range(FIELDS)
        )
        before = rss_mib()
        for _ in range(count):
            connection = socket.create_connection(("127.0.0.1", port))
            connection.sendall(head)
            connections.append(connection)
        # The last sends may still sit in the socket buffers: read the RSS
        # until it stops moving (ten reads 100 ms apart alike, or 10 s).
        held, same, deadline = rss_mib(), 0, time.monotonic() + 10
        while same < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
            now = rss_mib()
            same = same + 1 if now == held else 0
            held = now
        each = (held - before) * 1024 / count
        print(f"| {binary} | {count} | {len(head):,} | {before} | {held} | {each:.0f} |")
    finally:
        proxy.kill()
        for connection in connections:
            connection.close()


if __name__ == "__main__":
    main()
