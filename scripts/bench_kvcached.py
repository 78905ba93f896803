"""Starts a real kvcached for the Python benchmark scripts (fork_benchmark.py,
local_read_benchmark.py): `config` is the ServerConfig text, written to tmp; the server
listens on 127.0.0.1 port 0. Exits the script when kvcached does not start in 15 s."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import threading
from typing import List, Tuple

LISTENING = re.compile(r"kvcached listening on (127\.0\.0\.1:\d+)")


def start_kvcached(binary: str, config: str, tmp: pathlib.Path) -> Tuple[subprocess.Popen, str]:
    """(the process, its host:port)."""
    path = tmp / "kvcached.textproto"
    path.write_text(config)
    proc = subprocess.Popen([binary, "--listen=127.0.0.1:0", f"--config={path}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    found, target = threading.Event(), []  # type: threading.Event, List[str]

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            m = LISTENING.search(line)
            if m and not target:
                target.append(m.group(1))
                found.set()
        found.set()

    threading.Thread(target=read, daemon=True).start()
    if not found.wait(15) or not target:
        proc.kill()
        sys.exit("kvcached did not start")
    return proc, target[0]
