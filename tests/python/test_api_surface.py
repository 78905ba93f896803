"""Client and AsyncClient are two drivers of one set of calls (kvcache/_calls.py,
kvcache/_streams.py): the same public methods with the same signatures and documentation,
blocking on one, coroutines on the other, so a program moves between them by adding await."""

import inspect

import kvcache
from kvcache import _calls


def _public(cls: type) -> dict:
    return {name: getattr(cls, name) for name in dir(cls)
            if not name.startswith("_") and callable(getattr(cls, name))}


def test_both_clients_offer_the_same_calls_with_the_same_signatures() -> None:
    sync, aio = _public(kvcache.Client), _public(kvcache.AsyncClient)
    assert set(sync) == set(aio)
    for name in _calls.PUBLIC:
        assert inspect.signature(sync[name]) == inspect.signature(aio[name]), name
        assert "Step[" not in str(inspect.signature(sync[name])), name
        assert sync[name].__doc__ and sync[name].__doc__ == aio[name].__doc__, name
        assert not inspect.iscoroutinefunction(sync[name]), name
        assert inspect.iscoroutinefunction(aio[name]), name
    for name in ("close", "__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(kvcache.AsyncClient, name)), name


def test_both_streams_offer_the_same_calls() -> None:
    for sync, aio, calls in ((kvcache.AppendStream, kvcache.AsyncAppendStream,
                              ("append", "finish")),
                             (kvcache.AttendSession, kvcache.AsyncAttendSession,
                              ("attend", "close"))):
        for name in calls:
            assert inspect.signature(getattr(sync, name)) == \
                inspect.signature(getattr(aio, name)), name
            assert inspect.iscoroutinefunction(getattr(aio, name)), name
            assert not inspect.iscoroutinefunction(getattr(sync, name)), name
        assert hasattr(sync, "cancel") and hasattr(aio, "cancel")
