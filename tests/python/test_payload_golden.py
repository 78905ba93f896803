"""The Python transfer reader follows the transfer library's payload rule (transfer/payload.h):
for random leases, its renumbering of every segment's blocks and where each storage format's
blocks lie in a SendLease payload equal what kvc-payload-golden, built on that library, says.
"""

from __future__ import annotations

import pathlib
import random
import subprocess

import pytest

from conftest import kvcached_binary
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from kvcache._transfer import plan


def golden_tool() -> pathlib.Path:
    # Built beside kvcached: <build>/cachesvc/kvcached -> <build>/tests/transfer/.
    tool = kvcached_binary().parents[1] / "tests" / "transfer" / "kvc-payload-golden"
    if not tool.exists():
        pytest.fail(f"{tool} is missing: build the tests (ninja -C build kvc-payload-golden)",
                    pytrace=False)
    return tool


def random_lease(rng: random.Random) -> svc.Lease:
    lease = svc.Lease()
    formats = rng.sample(range(1, 9), rng.randint(1, 3))
    for f in sorted(formats):
        lease.arenas.add(format=f, block_bytes=rng.choice([256, 1152, 2432, 4096, 1 << 20]))
    for layer in range(rng.randint(1, 4)):
        for head in range(rng.randint(1, 3)):
            lane = lease.lanes.add(layer=layer, kv_head=head)
            for f in rng.sample(formats, rng.randint(1, len(formats))):
                seg = lane.segments.add(format=f)
                seg.blocks.extend(rng.randrange(0, 100000) for _ in range(rng.randint(0, 40)))
    return lease


def test_the_reader_follows_the_transfer_librarys_payload_rule() -> None:
    rng = random.Random(38)
    tool = golden_tool()
    for _ in range(50):
        lease = random_lease(rng)
        description = "".join(f"arena {a.format} {a.block_bytes}\n" for a in lease.arenas)
        description += "".join(f"segment {s.format} {len(s.blocks)}\n"
                               for lane in lease.lanes for s in lane.segments)
        out = subprocess.run([str(tool)], input=description, capture_output=True, text=True,
                             check=True).stdout.splitlines()
        firsts = [int(line.split()[1]) for line in out if line.startswith("segment ")]
        formats = {int(w[1]): (int(w[2]), int(w[3]))
                   for w in (line.split() for line in out if line.startswith("format "))}
        total = int(next(line for line in out if line.startswith("total ")).split()[1])

        renumbered, spans, mine = plan(lease)
        segments = [s for lane in renumbered.lanes for s in lane.segments]
        assert len(segments) == len(firsts)
        for seg, first in zip(segments, firsts):
            if len(seg.blocks):
                assert list(seg.blocks) == list(range(first, first + len(seg.blocks)))
        assert {f: span for f, span in spans.items() if span[1] > 0} == formats
        assert mine == total
