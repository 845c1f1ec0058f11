"""The router's side of the picker's accounting: the requests in flight at each endpoint, and a finished request's
work taken out of what the picker believes it sent (the picker records sends itself, in `pick`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from inferfleet_operator.plan.endpoint_picker import EndpointPicker, PickRequest, SentWork


@dataclass(eq=False)
class Flight:
    """One request sent to one endpoint."""

    address: str
    sent_at: float  # the `now` the picker recorded the send at
    num_prompt_tokens: int
    num_output_tokens: int  # expected: the PickRequest's
    is_recorded: bool  # the picker counted the send (False: FailOpen chose around a failing picker)
    has_first_byte: bool = False  # the upstream answered: its prompt is processed
    num_generated: int = 0  # output tokens seen so far: stream chunks, or the usage of the answer

    @property
    def work(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


def record_finished(sent: SentWork, finished: Flight, others: Sequence[Flight]) -> SentWork:
    """The picker's accounting of an endpoint once one of its requests finished: the finished request's share of the
    work the picker believes outstanding taken out (shares by the work each request was sent with, as the picker's
    drain is linear), and never more left than the requests still in flight can have by the tokens seen of them."""
    total = finished.work + sum(f.work for f in others)
    keep = 1.0 - finished.work / total if total > 0 else 0.0
    max_prompt = sum(f.num_prompt_tokens for f in others if not f.has_first_byte)
    max_output = sum(max(f.num_output_tokens - f.num_generated, 0) for f in others)
    entry = (finished.sent_at, finished.num_prompt_tokens, finished.num_output_tokens)
    recent = list(sent.recent)
    if entry in recent:
        recent.remove(entry)
    return replace(
        sent,
        num_prompt_tokens=min(sent.num_prompt_tokens * keep, max_prompt),
        num_output_tokens=min(sent.num_output_tokens * keep, max_output),
        num_requests=min(sent.num_requests * keep, len(others)),
        recent=tuple(recent),
    )


class Ledger:
    """Flights by endpoint, over one EndpointPicker (whose `sent` it corrects when a flight ends)."""

    def __init__(self, picker: EndpointPicker) -> None:
        self.picker = picker
        self._flights: dict[str, list[Flight]] = {}

    def start(self, address: str, request: PickRequest, now: float, is_recorded: bool) -> Flight:
        flight = Flight(address, now, request.num_prompt_tokens, request.num_output_tokens, is_recorded)
        self._flights.setdefault(address, []).append(flight)
        return flight

    def finish(self, flight: Flight) -> None:
        flights = self._flights[flight.address]
        flights.remove(flight)
        if not flights:
            del self._flights[flight.address]
        sent = self.picker.sent.get(flight.address)
        if flight.is_recorded and sent is not None:
            others = [f for f in flights if f.is_recorded]
            self.picker.sent[flight.address] = record_finished(sent, flight, others)

    def num_in_flight(self, address: str) -> int:
        return len(self._flights.get(address, ()))
