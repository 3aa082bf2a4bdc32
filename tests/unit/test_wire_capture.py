"""The wire capture keeps what a restructuring must not change (kinds, keys, the number of events) and nothing
that varies from run to run (ids, times, text)."""

from __future__ import annotations

from benchmarks.wire_capture import _first_difference, _sse_events, compare, shape


def test_a_shape_keeps_kinds_and_keys_and_hides_values() -> None:
    event = {"type": "response.done", "response": {"id": "resp_1", "status": "cancelled", "usage": None,
                                                   "output": [{"role": "assistant", "text": "Paris."}]}}
    assert shape(event) == {"type": "response.done", "response": {
        "id": "str", "status": "cancelled", "usage": None, "output": [{"role": "assistant", "text": "str"}]}}
    assert shape({"id": "resp_2", "n": 3}) == shape({"id": "resp_9", "n": 4})


def test_sse_bodies_become_events_with_their_names() -> None:
    body = 'event: delta\ndata: {"v": "Pa"}\n\nevent: delta\ndata: {"v": "ris"}\n\ndata: [DONE]\n\n'
    assert _sse_events(body) == [{"event": "delta", "data": {"v": "str"}}, {"event": "delta", "data": {"v": "str"}},
                                 {"event": None, "data": "str"}]


def test_a_difference_is_found_and_named(capsys) -> None:
    first = {"realtime": [{"type": "response.created"}, {"type": "response.done"}]}
    assert _first_difference(first, first) is None
    second = {"realtime": [{"type": "response.created"}, {"type": "response.cancelled"}]}
    assert _first_difference(first, second) == "/realtime[1]/type: 'response.done' / 'response.cancelled'"
    assert _first_difference(first, {"realtime": first["realtime"][:1]}) == "/realtime: 2 / 1 entries"
    assert compare(first, first) and not compare(first, second)
    assert "realtime: differs at realtime[1]/type" in capsys.readouterr().out
