"""Subject names: fixed strings peers of different versions agree on, namespaced, distinct, and
the wildcard / per-instance forms the services subscribe and publish with."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from contracts.subjects import CLAIM_HEADER, DISPATCHER_QUEUE, ENCODER_QUEUE, SERVICES, TOOLS_QUEUE, Subjects

# what BusSettings.namespace / instance_id look like (the claims stream's name needs this alphabet)
NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-", min_size=1, max_size=16)
INSTANCES = ("p1", "g1", "3f2a9c0d1e4b", "list", "call", "jobs", "cancel")  # also names of fixed subjects' tokens
EVERY_SERVICE = (*SERVICES, "gateway")


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, ``>`` one or more trailing tokens."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def fixed(subjects: Subjects) -> list[str]:
    return [
        subjects.jobs,
        subjects.generate,
        subjects.tools_list,
        subjects.tools_call,
        subjects.cancel,
        subjects.response_cancel,
        subjects.metrics,
        subjects.encoder_count,
        subjects.routing_notes,
        subjects.routing_snapshot,
    ]


def concrete(subjects: Subjects, instances: tuple[str, ...] = INSTANCES) -> list[str]:
    """Every subject a service publishes to or subscribes to without a wildcard."""
    return [
        *fixed(subjects),
        *(subjects.encoder_jobs(i) for i in instances),
        *(subjects.parser_tokens(i) for i in instances),
        *(subjects.gateway_events(i) for i in instances),
        *(subjects.heartbeat(s) for s in EVERY_SERVICE),
    ]


def valid_subject(subject: str) -> bool:
    return all(token and not re.search(r"[\s*>]", token) for token in subject.split("."))


def test_the_subject_names_on_the_wire() -> None:
    """Renaming one breaks a rolling upgrade: old and new peers would stop hearing each other."""
    s = Subjects()
    assert s.namespace == "chorus"
    assert {
        "jobs": s.jobs,
        "generate": s.generate,
        "tools_list": s.tools_list,
        "tools_call": s.tools_call,
        "cancel": s.cancel,
        "response_cancel": s.response_cancel,
        "metrics": s.metrics,
        "encoder_jobs": s.encoder_jobs("w1"),
        "parser_tokens": s.parser_tokens("p1"),
        "gateway_events": s.gateway_events("g1"),
        "heartbeat": s.heartbeat("parser"),
        "heartbeats": s.heartbeats,
        "encoder_count": s.encoder_count,
        "routing_notes": s.routing_notes,
        "routing_snapshot": s.routing_snapshot,
        "claims_stream": s.claims_stream,
    } == {
        "jobs": "chorus.encoder.jobs",
        "generate": "chorus.dispatcher.generate",
        "tools_list": "chorus.tools.list",
        "tools_call": "chorus.tools.call",
        "cancel": "chorus.cancel",
        "response_cancel": "chorus.responses.cancel",
        "metrics": "chorus.metrics",
        "encoder_jobs": "chorus.encoder.jobs.w1",
        "parser_tokens": "chorus.tokens.p1",
        "gateway_events": "chorus.events.g1",
        "heartbeat": "chorus.heartbeat.parser",
        "heartbeats": "chorus.heartbeat.*",
        "encoder_count": "chorus.encoder.count",
        "routing_notes": "chorus.routing.notes",
        "routing_snapshot": "chorus.routing.snapshot",
        "claims_stream": "CLAIMS_chorus",
    }


def test_every_subject_is_covered_here() -> None:
    """A new subject must be added to ``concrete`` (and so to the distinctness checks)."""
    members = {name for name, value in vars(Subjects).items() if isinstance(value, property) or callable(value)}
    members -= {name for name in members if name.startswith("_")}
    assert members == {
        "jobs",
        "encoder_jobs",
        "generate",
        "tools_list",
        "tools_call",
        "cancel",
        "response_cancel",
        "metrics",
        "parser_tokens",
        "gateway_events",
        "heartbeat",
        "heartbeats",
        "encoder_count",
        "routing_notes",
        "routing_snapshot",
        "claims_stream",
    }


@given(NAME)
def test_subjects_are_namespaced_valid_and_distinct(namespace: str) -> None:
    subjects = concrete(Subjects(namespace))
    assert len(set(subjects)) == len(subjects)
    for subject in subjects:
        assert subject.startswith(namespace + ".")
        assert valid_subject(subject), subject


@given(NAME, NAME)
def test_namespaces_do_not_hear_each_other(a: str, b: str) -> None:
    assume(a != b)
    sa, sb = Subjects(a), Subjects(b)
    assert not set(concrete(sa)) & set(concrete(sb))
    assert not any(matches(sa.heartbeats, subject) for subject in concrete(sb))
    assert sa.claims_stream != sb.claims_stream


@given(NAME, NAME, NAME)
def test_instance_subjects_are_per_instance(namespace: str, one: str, other: str) -> None:
    s = Subjects(namespace)
    assert s.parser_tokens(one) != s.gateway_events(one)
    assert (s.parser_tokens(one) == s.parser_tokens(other)) == (one == other)
    assert (s.gateway_events(one) == s.gateway_events(other)) == (one == other)
    assert (s.heartbeat(one) == s.heartbeat(other)) == (one == other)
    assert s.parser_tokens(one) not in fixed(s) and s.gateway_events(one) not in fixed(s)


@given(NAME)
def test_the_heartbeats_wildcard_hears_every_service_and_nothing_else(namespace: str) -> None:
    s = Subjects(namespace)
    assert not valid_subject(s.heartbeats)  # a pattern, never published to
    for service in EVERY_SERVICE:
        assert matches(s.heartbeats, s.heartbeat(service))
    others = [subject for subject in concrete(s) if subject not in {s.heartbeat(x) for x in EVERY_SERVICE}]
    assert others
    assert not any(matches(s.heartbeats, subject) for subject in others)


@pytest.mark.parametrize("service", EVERY_SERVICE)
def test_service_names_are_one_subject_token(service: str) -> None:
    """``heartbeats`` matches one token after ``heartbeat.``: a dotted service name would be missed."""
    assert re.fullmatch(r"[a-z][a-z_-]*", service)


def test_queue_groups() -> None:
    queues = (ENCODER_QUEUE, DISPATCHER_QUEUE, TOOLS_QUEUE)
    assert len(set(queues)) == len(queues)
    assert set(queues) <= set(SERVICES)


@given(NAME)
def test_the_claims_stream_name_is_valid_for_jetstream(namespace: str) -> None:
    """A JetStream stream name: no whitespace, '.', '*', '>', path separators."""
    stream = Subjects(namespace).claims_stream
    assert re.fullmatch(r"[A-Za-z0-9_-]+", stream) and stream.endswith(namespace)


def test_claim_header_is_a_valid_header_name() -> None:
    assert re.fullmatch(r"[!-9;-~]+", CLAIM_HEADER)  # visible ASCII, no colon


def test_subjects_is_frozen_and_a_value() -> None:
    s = Subjects("a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.namespace = "b"  # type: ignore[misc]
    assert s == Subjects("a") and hash(s) == hash(Subjects("a")) and s != Subjects("b")
