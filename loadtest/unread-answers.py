#!/usr/bin/env python3
"""Many connections each asking for a large answer and not reading it.

Starts a Loki stand-in that answers every request with ANSWER_BYTES
(default 8 MiB), the proxy in front of it, opens CONNECTIONS connections
as one credential, each sending one query_range, reading the first
READ_BYTES of its answer (default 1 MiB: enough for the kernel to grow the
connections' buffers, as a client that reads and then stalls does) and no
more. Prints the proxy's RSS before and while they are held, and what the
kernel holds for the proxy's sockets (`ss -tmp`): bytes received and not
read (the upstream's answers) and bytes queued to send (towards the
clients). A memory cgroup v2 charges both to the pod.

    [ANSWER_BYTES=8388608] [READ_BYTES=1048576] [PROXY_LIMITS='  key: value\\n'] \\
        python3 loadtest/unread-answers.py PROXY_BINARY [CONNECTIONS]   # 100

PROXY_LIMITS adds keys to the proxy's `limits` section, e.g.
'  upstream_receive_buffer_bytes: 131072\\n' (the manifests' value).
MODE=anonymous: no credential; each connection pipelines requests (401s)
as fast as the proxy takes them, reads READ_BYTES of the answers, then
reads none and sends on until the proxy stops taking requests.
MODE=read: one connection reads CONNECTIONS whole answers in turn, and
the proxy's CPU and the wall time per answer are printed instead (what
relaying a large answer costs).

Loopback only; every port is a free one; the proxy is killed at the end,
the stand-in with this process. Each connection's read is bounded by a
timeout.
"""
import base64
import os
import select
import socket
import sys
import threading
import time

from local_proxy import LocalProxy

ANSWER_BYTES = int(os.environ.get("ANSWER_BYTES", str(8 << 20)))
READ_BYTES = int(os.environ.get("READ_BYTES", str(1 << 20)))
LIMITS = os.environ.get("PROXY_LIMITS", "").encode().decode("unicode_escape")
USER = b"team-b:team-b-password"  # examples/proxy/tenants.yaml, logs:read


def serve_large_answers(listener):
    """Every request on every connection gets ANSWER_BYTES of JSON-ish
    bytes; a send blocks while the proxy does not read."""
    chunk = b" " * (1 << 20)
    head = (
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        f"content-length: {ANSWER_BYTES}\r\n\r\n"
    ).encode()

    def answer(connection):
        with connection:
            received = b""
            while True:
                while b"\r\n\r\n" not in received:
                    try:
                        data = connection.recv(65536)
                    except OSError:
                        return  # the proxy gave up the connection
                    if not data:
                        return
                    received += data
                received = received.split(b"\r\n\r\n", 1)[1]
                try:
                    connection.sendall(head)
                    left = ANSWER_BYTES
                    while left:
                        n = min(left, len(chunk))
                        connection.sendall(chunk[:n])
                        left -= n
                except OSError:
                    return

    while True:
        connection, _ = listener.accept()
        threading.Thread(target=answer, args=(connection,), daemon=True).start()


def read_answers(connection, size):
    read = 0
    while read < size:
        data = connection.recv(min(65536, size - read))
        if not data:
            raise SystemExit(f"the proxy closed a connection after {read} bytes")
        read += len(data)


def pipeline(connection):
    """Requests without a credential, pipelined as fast as the proxy takes
    them, their 401s read up to READ_BYTES (so that the kernel grows the
    connection's buffers to the pace), then none read while more requests
    are sent until the proxy stops taking them (a send waits 2 s)."""
    requests = b"GET /loki/api/v1/labels HTTP/1.1\r\nhost: proxy\r\n\r\n" * 100
    connection.setblocking(False)
    read = 0
    while read < READ_BYTES:
        readable, writable, _ = select.select([connection], [connection], [], 5)
        if not readable and not writable:
            raise SystemExit("the proxy neither reads nor answers")
        if writable:
            try:
                connection.send(requests)
            except BlockingIOError:
                pass
        if readable:
            data = connection.recv(65536)
            if not data:
                raise SystemExit(f"the proxy closed a connection after {read} bytes")
            read += len(data)
    connection.settimeout(2)
    try:
        for _ in range(200_000):  # 1 GB at most
            connection.sendall(requests)
        raise SystemExit("the proxy took 1 GB of requests whose answers were not read")
    except TimeoutError:
        pass  # the proxy stopped reading: its answers are not taken


def relay_cost(proxy, request, count):
    """Reads `count` whole answers on one connection, one after another;
    returns the proxy's CPU (user and system) and the wall time per answer,
    in ms, after five not counted."""

    def cpu_seconds():
        with open(f"/proc/{proxy.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    connection = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
    proxy.connections.append(connection)

    def one():
        connection.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            received += connection.recv(65536)
        read_answers(connection, ANSWER_BYTES - len(received.split(b"\r\n\r\n", 1)[1]))

    for _ in range(5):
        one()
    cpu, wall = cpu_seconds(), time.monotonic()
    for _ in range(count):
        one()
    return (cpu_seconds() - cpu) / count * 1e3, (time.monotonic() - wall) / count * 1e3


def main():
    binary = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=serve_large_answers, args=(listener,), daemon=True).start()
    upstream = f"http://127.0.0.1:{listener.getsockname()[1]}"
    proxy = LocalProxy(binary, LIMITS, logs_upstream=upstream)
    try:
        auth = "Basic " + base64.b64encode(USER).decode()
        request = (
            "GET /loki/api/v1/query_range?query=%7Bapp%3D%22a%22%7D HTTP/1.1\r\n"
            f"host: proxy\r\nauthorization: {auth}\r\n\r\n"
        ).encode()
        mode = os.environ.get("MODE", "unread")
        if mode == "read":
            cpu, wall = relay_cost(proxy, request, count)
            print(f"| {binary} | {count} | {ANSWER_BYTES:,} | {cpu:.2f} | {wall:.1f} |")
            return
        anonymous = mode == "anonymous"
        before = proxy.rss_mib()
        before_kernel = proxy.socket_memory_kib()
        for _ in range(count):
            connection = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
            if anonymous:
                pipeline(connection)
            else:
                connection.sendall(request)
                read_answers(connection, READ_BYTES)
            proxy.connections.append(connection)
        held = proxy.settled_rss_mib()
        received, queued = proxy.socket_memory_kib()
        print(
            f"| {count} | {ANSWER_BYTES:,} | {READ_BYTES:,} | {before} -> {held} | "
            f"{before_kernel[0] + before_kernel[1]} -> {received:,} + {queued:,} |"
        )
    finally:
        proxy.kill()


if __name__ == "__main__":
    main()
