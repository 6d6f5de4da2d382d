#!/usr/bin/env python3
"""Many connections each holding a large body but for its last byte.

Starts the proxy (label mode, its upstream a closed port: no body is ever
forwarded) with limits.max_large_body_bytes_held at the manifests' 32 MiB,
opens CONNECTIONS connections as one credential, sends each a 2 MB
remote-write body (or BODY_BYTES) but for its last byte, and prints the
proxy's RSS before and while they are held, with
tenant_proxy_large_body_bytes. The bytes are random: the proxy never gets
to read them as a push.

    [BODY_BYTES=250000] [MAX_CONCURRENT_REQUESTS=1024] \
        python3 loadtest/stalled-bodies.py PROXY_BINARY [CONNECTIONS]   # 150

MAX_CONCURRENT_REQUESTS sets limits.max_concurrent_requests (off if unset).

Loopback only; every port is a free one; the proxy is killed at the end.
"""
import base64
import os
import sys
import urllib.request

from local_proxy import LocalProxy

BODY_BYTES = int(os.environ.get("BODY_BYTES", "2000000"))
MAX_CONCURRENT_REQUESTS = int(os.environ.get("MAX_CONCURRENT_REQUESTS", "0"))
BOUND = 32 << 20
USER = b"team-b:team-b-password"  # examples/proxy/tenants.yaml


def main():
    binary = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    proxy = LocalProxy(
        binary,
        f"  max_large_body_bytes_held: {BOUND}\n"
        f"  max_concurrent_requests: {MAX_CONCURRENT_REQUESTS}\n",
    )

    def large_body_bytes():
        for line in proxy.admin_get("/metrics").splitlines():
            if line.startswith("tenant_proxy_large_body_bytes "):
                return int(line.split()[1])

    try:
        auth = "Basic " + base64.b64encode(USER).decode()
        # One query first, so that the credential is verified once, not
        # by every connection at once.
        first = urllib.request.Request(
            f"http://127.0.0.1:{proxy.port}/api/v1/query?query=up",
            headers={"Authorization": auth},
        )
        try:
            urllib.request.urlopen(first)
        except urllib.error.HTTPError:
            pass  # 502: no upstream; the credential is verified all the same
        head = (
            f"POST /api/v1/write HTTP/1.1\r\nhost: proxy\r\nauthorization: {auth}\r\n"
            "content-type: application/x-protobuf\r\ncontent-encoding: snappy\r\n"
            "x-prometheus-remote-write-version: 0.1.0\r\n"
            f"content-length: {BODY_BYTES}\r\n\r\n"
        ).encode()
        body = os.urandom(BODY_BYTES)
        # All of each body but its last byte.
        before, held = proxy.hold(count, head + body[:-1])
        print(f"| {binary} | {count} | {before} | {held} | {large_body_bytes():,} |")
    finally:
        proxy.kill()


if __name__ == "__main__":
    main()
