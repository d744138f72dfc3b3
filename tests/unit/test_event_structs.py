"""The stream's events are declared once, as tagged Structs (supervisor/events.py)."""

from __future__ import annotations

import msgspec
import pytest

from supervisor.convergence.status import RevisionStatus
from supervisor.events import EVENT_TYPES, Event, EventBus, Published, Rejected, StatusChanged
from supervisor.sinks.state import ActiveState
from supervisor.status_doc import ChildReport


def wire(event: Event) -> dict[str, object]:
    """What a stream client receives of ``event``, key order kept."""
    decoded: dict[str, object] = msgspec.json.decode(msgspec.json.encode(event))
    return decoded


def test_emit_stamps_seq_and_at_and_keeps_the_order_clients_see() -> None:
    bus = EventBus()
    unstamped = Published(revision=3, generation=1, source="control_plane", took_s=0.25)
    with bus.subscribe() as sub:
        first = bus.emit(unstamped)
        second = bus.emit(Rejected(revision=4, reason="secret", detail="env:X unset",
                                   active=3))
        assert [sub.receive.receive_nowait(), sub.receive.receive_nowait()] == [first, second]
    assert list(wire(first)) == ["type", "seq", "at", "revision", "generation", "source",
                                 "took_s"]
    assert (wire(first)["type"], first.seq, second.seq) == ("published", 1, 2)
    assert first.at.endswith("Z")
    assert (unstamped.seq, unstamped.at) == (0, "")  # the producer's Struct is left alone


def test_a_status_event_carries_only_the_sections_that_changed() -> None:
    event = EventBus().emit(StatusChanged(children={"listen": ChildReport(
        state="backoff", restarts=1, last_error="boom")}))
    assert set(wire(event)) == {"type", "seq", "at", "children"}


def test_the_wire_form_decodes_back_into_the_declared_struct() -> None:
    """A client can decode every event with the same Structs (tag ``type``)."""
    bus = EventBus()
    sent = [bus.emit(Published(revision=1, generation=1, source="last_known_good",
                               took_s=0.0)),
            bus.emit(StatusChanged(control_plane_up=False,
                                   revision=RevisionStatus(ActiveState(), clock=lambda: 0.0).report()))]
    decoded = [msgspec.json.decode(msgspec.json.encode(e), type=Published | Rejected
                                   | StatusChanged) for e in sent]
    assert decoded == sent
    assert isinstance(decoded[1], StatusChanged) and decoded[1].control_plane_up is False
    assert decoded[1].children is msgspec.UNSET


def test_every_event_type_is_registered_by_its_tag() -> None:
    assert set(EVENT_TYPES) == {"published", "rejected", "status"}
    assert all(issubclass(cls, Event) for cls in EVENT_TYPES.values())
    with pytest.raises(TypeError):
        Published(revision=1)  # type: ignore[call-arg]
