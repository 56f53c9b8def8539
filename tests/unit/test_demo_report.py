"""The demo report's pure parts: what counts as an answer, per-host samples, lifecycles, counts."""

from __future__ import annotations

from grid.testfleet.demo import Answer, DemoReport, ResidencyTransition


def _ok(persona: str, model: str, host: str, ms: float, tokens: int = 8) -> Answer:
    return Answer(persona, model, model, host, 200, 1, ms, response_id=f"id-{persona}-{ms}", prompt_tokens=5,
                  completion_tokens=tokens, content_chars=3)


def test_an_answer_needs_an_id_usage_and_text() -> None:
    assert _ok("p", "m", "h1", 10.0).ok
    assert not Answer("p", "m", "m", "h1", 200, 1, 10.0, response_id="x", prompt_tokens=1, completion_tokens=1).ok
    assert not Answer("p", "m", "m", "h1", 200, 1, 10.0, prompt_tokens=1, completion_tokens=1, content_chars=2).ok
    assert not Answer("p", "auto", None, None, 503, 1, 5.0, reason="model_not_ready").ok


def test_performance_is_per_host_and_model_from_successful_answers_only() -> None:
    r = DemoReport(baseline_model="b", coding_model="c")
    r.answers = [_ok("p1", "b", "h1", 1000.0, 10), _ok("p2", "b", "h1", 3000.0, 30), _ok("p3", "c", "h2", 500.0),
                 Answer("p4", "auto", None, None, 503, 1, 4.0)]
    perf = r.performance()
    assert perf == {
        "h1": {"b": {"samples": 2, "p50_latency_ms": 3000.0, "max_latency_ms": 3000.0, "completion_tokens": 40,
                     "tokens_per_second": 10.0}},
        "h2": {"c": {"samples": 1, "p50_latency_ms": 500.0, "max_latency_ms": 500.0, "completion_tokens": 8,
                     "tokens_per_second": 16.0}},
    }


def test_lifecycles_keep_every_transition_in_order_per_residency() -> None:
    r = DemoReport(baseline_model="b", coding_model="c")
    r.transitions = [ResidencyTransition(1.0, "h2", "c", "absent", "loading"),
                     ResidencyTransition(1.5, "h1", "b", "absent", "ready"),
                     ResidencyTransition(2.0, "h2", "c", "loading", "cached"),
                     ResidencyTransition(4.0, "h2", "c", "cached", "warming"),
                     ResidencyTransition(7.0, "h2", "c", "warming", "ready")]
    life = r.lifecycles()
    assert list(life) == ["h1/b", "h2/c"]
    assert [s["to"] for s in life["h2/c"]] == ["loading", "cached", "warming", "ready"]
    assert life["h2/c"][0] == {"at": 1.0, "from": "absent", "to": "loading"}


def test_counts_and_requirements_decide_the_outcome() -> None:
    r = DemoReport(baseline_model="b", coding_model="c")
    r.answers = [_ok("p1", "b", "h1", 10.0), Answer("p2", "c", None, None, 503, 4, 9000.0)]
    assert r.counts() == {"b": {"sent": 1, "answered": 1, "refused": 0, "retried": 0},
                          "c": {"sent": 1, "answered": 0, "refused": 1, "retried": 1}}
    assert not r.passed  # no requirement checked yet is not a pass
    assert r.require("one", True, "fine")
    assert r.passed
    assert not r.require("two", False, "broken")
    assert not r.passed
    doc = r.to_json()
    assert doc["passed"] is False and [q["name"] for q in doc["requirements"]] == ["one", "two"]
    assert doc["answers"][1] == {"persona": "p2", "model": "c", "served_model": None, "host_id": None, "status": 503,
                                 "attempts": 4, "latency_ms": 9000.0, "response_id": None, "prompt_tokens": None,
                                 "completion_tokens": None, "content_chars": 0, "reason": None, "ok": False}
