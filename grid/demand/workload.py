"""Deterministic workload classifier over bounded request features.

The gateway calls :func:`classify` with the request's text while it is still in memory. The
function returns only a workload class and an approximate input size in units (about four
characters per unit); it keeps no reference to the text, caches nothing, and logs nothing.

Rules, in order:

1. the embeddings endpoint is ``embedding``;
2. an image or video modality (or endpoint) is ``image`` / ``video``;
3. otherwise the first :data:`SCAN_CHARS` characters are scored by per-class weighted regular
   expressions (matches per pattern are capped so one repeated word cannot dominate); the best
   class wins if it reaches :data:`MIN_SCORE`, ties broken by vocabulary order;
4. anything else is ``general`` (or, in a vocabulary without ``general``, its last entry).

A class in a custom vocabulary that has no built-in rules still scores its own name as a word.
A built-in class missing from the vocabulary never wins.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

import msgspec

from grid.events.requests import WORKLOADS

CHARS_PER_UNIT = 4
# Only the head of a prompt is scanned: classification cost is bounded per request.
SCAN_CHARS = 8192
# A class needs this much weighted evidence to beat the fallback.
MIN_SCORE = 2.0
# Matches of one pattern that count (bounded influence of repetition).
MAX_MATCHES_PER_PATTERN = 3

EMBEDDING_ENDPOINTS = frozenset({"embeddings", "embedding"})
IMAGE_NAMES = frozenset({"image", "images"})
VIDEO_NAMES = frozenset({"video", "videos"})

REASON_ENDPOINT = "endpoint"
REASON_MODALITY = "modality"
REASON_KEYWORDS = "keywords"
REASON_FALLBACK = "fallback"


class Classification(msgspec.Struct, frozen=True, kw_only=True):
    workload: str
    input_units: int
    reason: str = REASON_FALLBACK
    score: float = 0.0


# (weight, pattern). Patterns are case-insensitive; \b keeps them to whole words.
_RULES: dict[str, tuple[tuple[float, str], ...]] = {
    "coding": (
        (3.0, r"```"),
        (3.0, r"\bTraceback \(most recent call last\)"),
        (2.0, r"\b(?:def|class|import|return|lambda|async def)\s+\w"),
        (2.0, r"\b(?:function|const|let|var)\s+\w+\s*[=(]"),
        (2.0, r"#include\s*<|\bpublic static void\b|\bfn\s+\w+\s*\("),
        (1.0, r"\b(?:code|coding|bug|debug|compile[rd]?|refactor|stack ?trace|exception|segfault)\b"),
        (1.0, r"\b(?:python|javascript|typescript|rust|golang|java|c\+\+|sql|regex|bash|api|json|yaml)\b"),
        (1.0, r"\b(?:unit tests?|pull request|git|repository|function|variable|syntax error)\b"),
        (1.0, r"[{};]\s*$"),
    ),
    "research": (
        (1.0, r"\b(?:research|study|studies|paper|papers|literature|citations?|cite|sources?)\b"),
        (1.0, r"\b(?:hypothes[ie]s|evidence|experiment|methodology|dataset|survey|meta-analysis)\b"),
        (1.0, r"\b(?:summari[sz]e|analy[sz]e|compare|explain why|peer.reviewed|journal|arxiv|doi)\b"),
        (2.0, r"\bliterature review\b|\bsystematic review\b|\bet al\.?"),
    ),
    "marketing": (
        (1.0, r"\b(?:marketing|campaign|brand|branding|audience|engagement|seo|tagline|slogan)\b"),
        (1.0, r"\b(?:social media|newsletter|landing page|ad copy|press release|blog post|headline)\b"),
        (1.0, r"\b(?:instagram|tiktok|linkedin post|twitter|hashtags?|influencer|conversion rate)\b"),
        (2.0, r"\b(?:go-to-market|marketing plan|content calendar|value proposition)\b"),
    ),
    "sales": (
        (1.0, r"\b(?:sales|prospects?|leads?|deal|pipeline|quota|crm|upsell|cross-sell|churn)\b"),
        (1.0, r"\b(?:cold email|follow[- ]up email|discovery call|demo call|objections?|pricing)\b"),
        (1.0, r"\b(?:customer|client|proposal|quote|contract|renewal|account executive)\b"),
        (2.0, r"\b(?:sales pitch|sales script|closing the deal|outreach sequence)\b"),
    ),
    "design": (
        (1.0, r"\b(?:design|designs|ui|ux|wireframes?|mockups?|prototype|figma|sketch)\b"),
        (1.0, r"\b(?:layout|typography|colou?r palette|fonts?|logo|icons?|style guide|accessibility)\b"),
        (1.0, r"\b(?:user flow|user journey|component library|design system|css|spacing|grid layout)\b"),
        (2.0, r"\b(?:design system|visual hierarchy|user interface|user experience)\b"),
    ),
    "image": (
        (2.0, r"\b(?:generate|draw|render|paint|create) (?:an? )?(?:image|picture|photo|illustration)\b"),
        (1.0, r"\b(?:image|picture|photo|photograph|illustration|portrait|stable diffusion|midjourney)\b"),
    ),
    "video": (
        (2.0, r"\b(?:generate|render|create|make) (?:an? )?(?:video|animation|clip)\b"),
        (1.0, r"\b(?:video|animation|frames per second|fps|storyboard|footage|clip)\b"),
    ),
    "embedding": (
        (2.0, r"\b(?:embed(?:ding)?s? (?:this|these|the following))\b"),
    ),
}


@lru_cache(maxsize=64)
def _compiled(vocabulary: tuple[str, ...]) -> tuple[tuple[str, tuple[tuple[float, re.Pattern[str]], ...]], ...]:
    """Compiled rules for a vocabulary, in vocabulary order (cached by vocabulary, never text)."""
    out = []
    for name in vocabulary:
        rules = _RULES.get(name)
        if rules is None:
            if name == "general":
                continue
            rules = ((1.0, r"\b" + re.escape(name) + r"\b"),)
        out.append((name, tuple((w, re.compile(p, re.IGNORECASE | re.MULTILINE)) for w, p in rules)))
    return tuple(out)


def fallback_workload(vocabulary: Sequence[str] = WORKLOADS) -> str:
    if "general" in vocabulary:
        return "general"
    return vocabulary[-1] if vocabulary else "general"


def input_units(text: str | None) -> int:
    """Approximate size: about four characters per unit, at least one for any text."""
    if not text:
        return 0
    return (len(text) + CHARS_PER_UNIT - 1) // CHARS_PER_UNIT


def classify(
    endpoint: str, text: str | None, modality: str, vocabulary: Sequence[str] = WORKLOADS
) -> Classification:
    """Map one request to a workload class of ``vocabulary`` and approximate input units."""
    vocab = tuple(vocabulary)
    units = input_units(text)
    ep = (endpoint or "").strip().lower()
    mod = (modality or "").strip().lower()
    if ep in EMBEDDING_ENDPOINTS and "embedding" in vocab:
        return Classification(workload="embedding", input_units=units, reason=REASON_ENDPOINT)
    for names, cls in ((VIDEO_NAMES, "video"), (IMAGE_NAMES, "image")):
        if cls not in vocab:
            continue
        if mod in names:
            return Classification(workload=cls, input_units=units, reason=REASON_MODALITY)
        if ep in names:
            return Classification(workload=cls, input_units=units, reason=REASON_ENDPOINT)
    fallback = fallback_workload(vocab)
    if not text:
        return Classification(workload=fallback, input_units=units, reason=REASON_FALLBACK)
    head = text[:SCAN_CHARS]
    best, best_score = fallback, 0.0
    for name, rules in _compiled(vocab):
        score = 0.0
        for weight, pattern in rules:
            hits = 0
            for _ in pattern.finditer(head):
                hits += 1
                if hits >= MAX_MATCHES_PER_PATTERN:
                    break
            score += weight * hits
        # Strictly greater: the earlier vocabulary entry wins a tie.
        if score > best_score:
            best, best_score = name, score
    if best_score < MIN_SCORE:
        return Classification(workload=fallback, input_units=units, reason=REASON_FALLBACK, score=best_score)
    return Classification(workload=best, input_units=units, reason=REASON_KEYWORDS, score=best_score)
