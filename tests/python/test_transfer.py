"""Transfer channels through the Python client against a real kvcached with transfer_listen
and no local socket (a client on another node sees the same): fetch() receives the leased
blocks over the channel and returns exactly what the gRPC path returns (f16, bf16 and f32
pools, a layer subset, an unfinished layer, a layer ahead, a StreamingLLM-compacted
sequence), from many threads at once, ending every lease it took; INT4 records, and f16 ones
asked as f32, come over gRPC decoded by the server, or with client_decode over the channel,
decoded here (test_record_decode.py: every format); a channel the server closed, or one to a
server that restarted, is replaced on the next fetch; a refusal announced in the frame leaves
the channel usable; data_path says why a client stays on gRPC. AsyncClient takes the same
path (its reads off the event loop)."""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator

import numpy as np
import pytest

import kvcache
import kvcache._transfer as transfer_module
from conftest import HEAD_DIM, Server, fill_after_restart, start, threads_calling, wait_until
from kvcache import CompressionSpec, StreamingLLM
from kvcache._proto.kvcache.v1 import kvcache_service_pb2 as svc
from test_local_read import _filled, _same


@pytest.fixture(scope="module")
def transfer_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start(tmp_path_factory.mktemp("kvcached-transfer"), 'transfer_listen: "127.0.0.1:0"\n')
    yield s
    s.stop()


def _grpc_only(server: Server) -> kvcache.Client:
    return kvcache.Client(server.target, local_reads=False, transfers=False)


def test_fetch_over_the_channel_equals_fetch_over_grpc(transfer_server: Server) -> None:
    with kvcache.Client(transfer_server.target) as c, _grpc_only(transfer_server) as g:
        assert c.data_path == "grpc (no fetch yet)"
        seqs = [_filled(c, pool, 70) for pool in ("f16", "bf16", "f32")]
        ahead = _filled(c, "f16", 30, layers=1)  # layer 0 ahead of the others
        sink = _filled(c, "f16", 100)
        c.compress(sink, CompressionSpec(eviction=StreamingLLM(4, 30)))
        before_leases = c.pool_stats().leases
        before_sends = transfer_server.rpc_count("SendLease")
        sent = 0
        for seq in seqs + [ahead, sink]:
            for kwargs in ({}, {"layers": [2, 0]}, {"include_unfinished": True}):
                _same(c.fetch(seq, **kwargs), g.fetch(seq, **kwargs))
                sent += 1
        port = c._core.paths.transfer.where.rsplit(":", 1)[1]  # type: ignore[union-attr]
        assert c.data_path == f"transfer (127.0.0.1:{port})", c.data_path
        assert c.append_path == "grpc (no same-node path; transfer channels carry reads only)"
        assert g.data_path == "grpc (local_reads and transfers are off)"
        assert transfer_server.rpc_count("SendLease") - before_sends == sent
        after = c.pool_stats().leases
        assert after.granted - before_leases.granted == sent
        assert after.released - before_leases.released == sent and after.active == 0


def test_fetches_from_many_threads_share_one_channel(transfer_server: Server) -> None:
    with kvcache.Client(transfer_server.target) as c, _grpc_only(transfer_server) as g:
        seqs = [_filled(c, "f16", 40 + 13 * i) for i in range(4)]
        want = {seq: g.fetch(seq) for seq in seqs}
        errors = []

        def run(i: int) -> None:
            try:
                for round_ in range(5):
                    seq = seqs[(i + round_) % len(seqs)]
                    _same(c.fetch(seq), want[seq])
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert c.data_path.startswith("transfer ("), c.data_path
        assert c.pool_stats().leases.active == 0


def test_low_bit_records_come_over_grpc_unless_the_client_decodes(
        transfer_server: Server) -> None:
    with kvcache.Client(transfer_server.target) as c, _grpc_only(transfer_server) as g, \
            kvcache.Client(transfer_server.target, client_decode=True) as d:
        raw = _filled(c, "f16", 50)
        c.fetch(raw)  # decides the path
        d.fetch(raw)
        int4 = _filled(c, "f16", 50, policy=CompressionSpec(storage="int4_g32"))
        want = [g.fetch(int4), g.fetch(raw, dtype="f32")]
        sends = transfer_server.rpc_count("SendLease")
        fetches = transfer_server.rpc_count("Fetch")
        got = c.fetch(int4)
        _same(got, want[0])
        assert got.path == ("grpc (STORAGE_FORMAT_INT4_G32 records are decoded by the server "
                            "(client_decode is off))"), got.path
        _same(c.fetch(raw, dtype="f32"), want[1])
        # Leased, nothing sent, then fetched over gRPC (decoded by the server).
        assert transfer_server.rpc_count("SendLease") - sends == 0
        assert transfer_server.rpc_count("Fetch") - fetches == 2
        decoded = d.fetch(int4)
        _same(decoded, want[0])
        assert decoded.path == d.data_path and decoded.path.startswith("transfer (")
        _same(d.fetch(raw, dtype="f32"), want[1])
        # Received over the channel and decoded here.
        assert transfer_server.rpc_count("SendLease") - sends == 2
        assert transfer_server.rpc_count("Fetch") - fetches == 2
        assert c.data_path.startswith("transfer (") and d.data_path.startswith("transfer (")
        assert c.pool_stats().leases.active == 0
        with pytest.raises(kvcache.NotFound):
            c.fetch("no-such-sequence")
        assert c.data_path.startswith("transfer (")


def test_a_closed_channel_is_replaced_on_the_next_fetch(transfer_server: Server) -> None:
    with kvcache.Client(transfer_server.target) as c, _grpc_only(transfer_server) as g:
        seq = _filled(c, "bf16", 64)
        _same(c.fetch(seq), g.fetch(seq))
        first = c._core.paths.transfer
        assert first is not None
        opened = transfer_server.rpc_count("OpenTransfer")
        # Closed by the server (as an operator's restart of the listener would): the client
        # sees the hang-up before its next fetch and opens another channel.
        g._drive(g._core.unary("CloseTransfer", svc.CloseTransferRequest(transfer_id=first.id),
                               None, retry=False))
        assert wait_until(lambda: not first.alive())
        _same(c.fetch(seq), g.fetch(seq))
        assert c._core.paths.transfer is not None and c._core.paths.transfer is not first
        assert transfer_server.rpc_count("OpenTransfer") - opened == 1
        assert c.data_path.startswith("transfer (")


def test_data_path_says_why_a_client_stays_on_grpc(transfer_server: Server,
                                                   server: Server) -> None:
    with kvcache.Client(transfer_server.target, transfers=False) as off, \
            kvcache.Client(transfer_server.target, local_reads=False) as no_local, \
            kvcache.Client(server.target) as none_offered:
        for c in (off, no_local, none_offered):
            seq = _filled(c, "f16", 20)
            keys = c.fetch(seq)[(0, 0)].keys
            assert keys.shape == (20, keys.shape[1]) and np.isfinite(keys).all()
        assert off.data_path == "grpc (the server has no local_socket; transfers are off)"
        assert no_local.data_path.startswith("transfer ("), no_local.data_path
        assert none_offered.data_path == "grpc (the server has no local_socket)"


def test_async_client_receives_over_the_channel_too(transfer_server: Server) -> None:
    with _grpc_only(transfer_server) as g:
        f16 = _filled(g, "f16", 70)
        f32 = _filled(g, "f32", 33)
        int4 = _filled(g, "f16", 40, policy=CompressionSpec(storage="int4_g32"))
        kwargs = ({}, {"layers": [1]}, {"include_unfinished": True})
        want = [g.fetch(seq, **kw) for seq in (f16, f32, int4) for kw in kwargs]
        sends = transfer_server.rpc_count("SendLease")

    async def run() -> None:
        async with kvcache.AsyncClient(transfer_server.target) as c:
            assert c.data_path == "grpc (no fetch yet)"
            loop_thread = threading.get_ident()
            with threads_calling(transfer_module.TransferReader, "fetch") as reads:
                # Concurrent fetches share the one channel (its fetches run one at a time).
                got = await asyncio.gather(*[c.fetch(seq, **kw) for seq in (f16, f32, int4)
                                             for kw in kwargs])
            for expected, result in zip(want, got):
                _same(result, expected)
            assert c.data_path.startswith("transfer ("), c.data_path
            assert len(reads) == 6 and loop_thread not in reads  # never on the event loop
            with pytest.raises(kvcache.NotFound):
                await c.fetch("s-nothing")
        async with kvcache.AsyncClient(transfer_server.target, transfers=False) as c:
            _same(await c.fetch(f16), want[0])
            assert c.data_path == "grpc (the server has no local_socket; transfers are off)"

    asyncio.run(run())
    # The INT4 fetches went over gRPC without a SendLease (client_decode is off).
    assert transfer_server.rpc_count("SendLease") - sends == 6


def test_a_client_that_outlives_a_server_restart_opens_a_channel_to_the_new_one(
        tmp_path) -> None:
    config = 'transfer_listen: "127.0.0.1:0"\n'
    first = start(tmp_path, config)
    with kvcache.Client(first.target) as c:
        old = _filled(c, "f16", 40)
        assert c.fetch(old)[(0, 0)].keys.shape == (40, HEAD_DIM)
        assert c.data_path.startswith("transfer (")
        first.stop()
        second = start(tmp_path, config, listen=first.target)
        try:
            fill_after_restart(c)
            assert c.data_path.startswith("transfer ("), c.data_path
            assert second.rpc_count("SendLease") == 1
            with pytest.raises(kvcache.NotFound):
                c.fetch(old)
        finally:
            second.stop()


def test_a_refused_send_leaves_the_channel_usable(transfer_server: Server) -> None:
    """A lease that ended before SendLease: the server writes a frame with the refusal and no
    payload, the fetch raises it, and the channel stays in step for the next one."""
    with kvcache.Client(transfer_server.target) as c, _grpc_only(transfer_server) as g:
        seq = _filled(c, "f16", 30)
        _same(c.fetch(seq), g.fetch(seq))
        reader = c._core.paths.transfer
        assert reader is not None
        lease = c.lease_sequence(seq)
        c.release_lease(lease)

        def send(nonce: int):
            request = svc.SendLeaseRequest(transfer_id=reader.id, lease_id=lease.lease_id,
                                           nonce=nonce)
            return c._methods["SendLease"].future(request, timeout=10)

        with pytest.raises(kvcache.NotFound):
            reader.fetch(lease, send, 10, lambda renumbered, arenas: None)
        assert reader.alive()
        _same(c.fetch(seq), g.fetch(seq))
        assert c._core.paths.transfer is reader  # the same channel served it
