"""The proxy on loopback for the memory scripts (stalled-bodies.py,
partial-heads.py, unread-answers.py, idle-memory.py): started on free
ports with examples/proxy/tenants.yaml (or the tenants text given), label
mode towards a closed port (nothing is ever forwarded) unless given a Loki
upstream, its RSS read from /proc and its sockets' kernel memory from
`ss`, killed by its PID by the caller."""
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalProxy:
    def __init__(self, binary, limits="", logs_upstream=None, tenants=None):
        work = tempfile.mkdtemp()
        self.port, self.admin, closed = free_port(), free_port(), free_port()
        if tenants is None:
            with open(os.path.join(REPO, "examples/proxy/tenants.yaml")) as src:
                tenants = src.read()
        with open(f"{work}/tenants.yaml", "w") as out:
            out.write(tenants)
        with open(f"{work}/config.yaml", "w") as out:
            out.write(
                f"listen: 127.0.0.1:{self.port}\nadmin_listen: 127.0.0.1:{self.admin}\n"
                f"tenants_file: tenants.yaml\nmetrics:\n"
                f"  upstream: http://127.0.0.1:{closed}\n  mode: label\n"
                + (f"logs:\n  upstream: {logs_upstream}\n" if logs_upstream else "")
                + (f"limits:\n{limits}" if limits else "")
            )
        self.connections = []
        self.process = subprocess.Popen(
            [binary, "--config", f"{work}/config.yaml"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.admin_get("/readyz")
                return
            except OSError:
                if time.monotonic() > deadline:
                    self.kill()
                    raise
                time.sleep(0.05)

    def admin_get(self, path):
        url = f"http://127.0.0.1:{self.admin}{path}"
        return urllib.request.urlopen(url).read().decode()

    def rss_mib(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) // 1024

    def socket_memory_kib(self):
        """What the kernel holds for the proxy's TCP sockets, by `ss -tmp`:
        bytes received and not yet read (`r`), and queued to send and not
        yet acknowledged (`w`), summed over its sockets, in KiB. A memory
        cgroup v2 charges these to the pod beside its RSS."""
        out = subprocess.run(
            ["ss", "-tmpnH"], capture_output=True, text=True, check=True
        ).stdout
        received = queued = 0
        # Each socket: a line naming its process, then "\t skmem:(r..,w..)".
        for socket_lines in out.replace("\n\t", " ").splitlines():
            if f"pid={self.process.pid}," not in socket_lines:
                continue
            skmem = dict(re.findall(r"([a-z]+)(\d+)", socket_lines.split("skmem:(")[1]))
            received += int(skmem["r"])
            queued += int(skmem["w"])
        return received // 1024, queued // 1024

    def settled_rss_mib(self):
        """The RSS once it stops moving (ten reads 100 ms apart alike, or
        10 s): the last sends may still sit in the socket buffers."""
        held, same, deadline = self.rss_mib(), 0, time.monotonic() + 10
        while same < 10 and time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.rss_mib()
            same = same + 1 if now == held else 0
            held = now
        return held

    def hold(self, count, data):
        """Opens `count` connections, each sending `data` (which returns
        once the proxy has read it, the socket buffers holding far less)
        and then holding; returns the RSS before and once it settled."""
        before = self.rss_mib()
        for _ in range(count):
            connection = socket.create_connection(("127.0.0.1", self.port))
            connection.sendall(data)
            self.connections.append(connection)
        return before, self.settled_rss_mib()

    def kill(self):
        self.process.kill()
        for connection in self.connections:
            connection.close()
