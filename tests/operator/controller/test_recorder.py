"""EventRecorder: each Event is posted once per object, and a refused post never fails a reconcile."""

from __future__ import annotations

import asyncio

from inferfleet_operator.api.conditions import normal, warning
from inferfleet_operator.controller.recorder import EventRecorder
from inferfleet_operator.kube.client import ApiError

SERVICE = {"kind": "InferenceService", "metadata": {"name": "llama", "namespace": "ns", "uid": "u1"}}


class FakeKube:
    def __init__(self, refuse: bool = False):
        self.posted: list[str] = []
        self.refuse = refuse

    async def post_event(self, obj, *, type, reason, note, action):
        if self.refuse:
            raise ApiError(403, "Forbidden", "events is forbidden")
        self.posted.append(reason)


def test_an_event_is_posted_once_however_often_it_is_planned():
    kube = FakeKube()
    recorder = EventRecorder(kube)
    asyncio.run(recorder.post(SERVICE, [normal("Planned", "3 pools")], "Plan"))
    asyncio.run(recorder.post(SERVICE, [normal("Planned", "3 pools"), warning("Degraded", "1 pool")], "Plan"))
    assert kube.posted == ["Planned", "Degraded"]


def test_a_refused_event_is_logged_not_raised(caplog):
    asyncio.run(EventRecorder(FakeKube(refuse=True)).post(SERVICE, [warning("Degraded", "1 pool")], "Plan"))
    assert "Failed to post Event Degraded about InferenceService ns/llama" in caplog.text
