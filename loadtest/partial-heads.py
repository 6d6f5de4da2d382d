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
import sys

from local_proxy import LocalProxy

FIELDS = 95
FIELD_VALUE_BYTES = 620


def main():
    binary = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    proxy = LocalProxy(binary)
    try:
        head = b"GET /api/v1/query?query=up HTTP/1.1\r\nhost: proxy\r\n" + b"".join(
            b"x-pad-%d: %s\r\n" % (i, b"a" * FIELD_VALUE_BYTES) for i in range(FIELDS)
        )
        before, held = proxy.hold(count, head)
        each = (held - before) * 1024 / count
        print(f"| {binary} | {count} | {len(head):,} | {before} | {held} | {each:.0f} |")
    finally:
        proxy.kill()


if __name__ == "__main__":
    main()
