import sys

import msgspec
import pytest

from grid.events.requests import WORKLOADS
from grid.demand.workload import SCAN_CHARS, Classification, classify, input_units


def test_embeddings_endpoint_is_embedding_whatever_the_text():
    c = classify("embeddings", "def main(): return 1  ```python```", "text")
    assert c == Classification(workload="embedding", input_units=c.input_units, reason="endpoint")


@pytest.mark.parametrize("endpoint,modality,expected", [
    ("chat", "image", "image"),
    ("chat", "video", "video"),
    ("image", "text", "image"),
    ("video", "text", "video"),
])
def test_image_and_video_modality(endpoint, modality, expected):
    assert classify(endpoint, "write a python function", modality).workload == expected


@pytest.mark.parametrize("text,expected", [
    ("Traceback (most recent call last):\n  File 'x.py'\nValueError\nplease fix this bug", "coding"),
    ("```python\ndef add(a, b):\n    return a + b\n```\nrefactor this function", "coding"),
    ("Write a literature review of peer-reviewed studies on sleep, cite sources", "research"),
    ("Draft a social media campaign with hashtags and a tagline for our brand launch", "marketing"),
    ("Write a cold email to prospects in our pipeline and handle pricing objections", "sales"),
    ("Suggest a color palette, typography and layout for the wireframes in Figma", "design"),
    ("hello, how are you today?", "general"),
    ("", "general"),
])
def test_keyword_scoring(text, expected):
    assert classify("chat", text, "text").workload == expected


def test_input_units_are_about_four_chars():
    assert classify("chat", "abcd" * 100, "text").input_units == 100
    assert input_units("abcde") == 2
    assert input_units(None) == 0
    assert classify("chat", None, "text") == Classification(workload="general", input_units=0)


def test_ties_break_by_vocabulary_order():
    text = "brand campaign layout typography"  # marketing 2 points, design 2 points
    assert classify("chat", text, "text").workload == "marketing"
    reordered = ("design", "marketing", "general")
    assert classify("chat", text, "text", reordered).workload == "design"


def test_configurable_vocabulary():
    vocab = ("legal", "coding", "general")
    assert classify("chat", "a legal question about legal contracts", "text", vocab).workload == "legal"
    # A built-in class outside the vocabulary never wins; embeddings fall back too.
    assert classify("chat", "campaign brand tagline slogan", "text", vocab).workload == "general"
    assert classify("embeddings", "x", "text", vocab).workload == "general"
    # Without "general" the fallback is the last entry.
    assert classify("chat", "hi", "text", ("coding", "chat")).workload == "chat"


def test_only_the_head_is_scanned():
    text = "x" * SCAN_CHARS + " ```python def f(): return 1``` Traceback (most recent call last)"
    c = classify("chat", text, "text")
    assert c.workload == "general"
    assert c.input_units == input_units(text)


def test_prompt_text_is_not_retained():
    text = "".join(["please refactor this python function ", str(12345)]) * 10
    before = sys.getrefcount(text)
    results = [classify("chat", text, "text") for _ in range(50)]
    assert sys.getrefcount(text) == before
    encoded = msgspec.json.encode(results[0])
    assert b"refactor" not in encoded and results[0].workload == "coding"


def test_deterministic_and_in_vocabulary():
    texts = ["fix the bug in my sql query", "summarize this paper", "a logo design", "hi"]
    for t in texts:
        a = classify("chat", t, "text")
        assert a == classify("chat", t, "text")
        assert a.workload in WORKLOADS
