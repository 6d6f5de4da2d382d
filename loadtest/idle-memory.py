#!/usr/bin/env python3
"""Where an idle proxy's RSS is: its /proc/PID/smaps summed by mapping.

Starts the proxy with one tenant and CREDENTIALS more (each a tenant of
its own with one credential, as loadtest's reload-10k writes them; every
hash the same, so no password is ever checked), waits for /readyz, lets
it settle, and prints the RSS of each mapping kind: the binary's code and
read-only data, the heap, anonymous mappings (thread stacks, large
allocations), the shared libraries. Compare two binaries by running it
for each; `heaptrack` on the same set-up names the heap's call sites.

    python3 loadtest/idle-memory.py PROXY_BINARY [CREDENTIALS]   # 0

Loopback only; every port is a free one; the proxy is killed at the end.
"""
import collections
import json
import os
import sys

from local_proxy import LocalProxy

# examples/proxy/tenants.yaml's first hash (grafana-a-password).
HASH = "$argon2id$v=19$m=19456,t=2,p=1$ffOyyvMtboRwRWw/8YP15g$5nbYwx2MFPMi817ikMjp+e/Bq0RNEUXxujikiyLNAf0"


def tenants_file(credentials):
    tenants = [
        {"id": f"tenant-{i}", "users": [{"username": f"user-{i}", "password_hash": HASH}]}
        for i in range(1 + credentials)
    ]
    return json.dumps({"version": 1, "tenants": tenants})


def rss_by_mapping(pid):
    """KiB of RSS by (file name or [heap]/[anon]/[stack], permissions)."""
    rss, mapping = collections.Counter(), None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if fields[0].endswith(":"):
                if fields[0] == "Rss:":
                    rss[mapping] += int(fields[1])
            else:  # a mapping's first line: range, permissions, offset, device, inode, name
                name = os.path.basename(fields[5]) if len(fields) > 5 else "[anon]"
                mapping = (name, fields[1])
    return rss


def main():
    binary = sys.argv[1]
    credentials = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    proxy = LocalProxy(binary, tenants=tenants_file(credentials))
    try:
        proxy.settled_rss_mib()
        pid = proxy.process.pid
        rss = rss_by_mapping(pid)
        threads = len(os.listdir(f"/proc/{pid}/task"))
        print(f"{binary}: {credentials + 1} credentials, {threads} threads, RSS {sum(rss.values())} KiB")
        for (name, permissions), kib in rss.most_common(10):
            print(f"  {kib:8} KiB  {name} {permissions}")
    finally:
        proxy.kill()


if __name__ == "__main__":
    main()
