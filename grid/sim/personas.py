"""User personas: who asks for what, named or `auto`, in words the real classifier reads.

A persona has a workload mix and a share of requests that name a model. Request text comes
from small templates per workload; the workload a request counts under is whatever the
production classifier (grid.demand.workload.classify) makes of that text, endpoint and
modality, never a label the lab assigns.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from grid.demand.workload import classify

# workload -> (endpoint, modality, prompt templates)
TEMPLATES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "coding": ("chat", "text", (
        "Fix this bug in my python function: def total(xs): return sum(xs) + 1 ```",
        "Refactor this javascript: const add = (a, b) => a + b; write unit tests too",
        "Why does my SQL query raise a syntax error? Traceback (most recent call last): ...",
        "Write a bash script that compiles the repository and runs the unit tests",
    )),
    "research": ("chat", "text", (
        "Summarize the literature review on sleep studies and cite the sources",
        "Compare the methodology of these two papers and the evidence for each hypothesis",
        "Find peer-reviewed journal studies about remote work and summarize the evidence",
    )),
    "marketing": ("chat", "text", (
        "Write a tagline and social media campaign for our new brand launch",
        "Draft a newsletter and landing page headline for the marketing campaign",
        "Plan a content calendar for instagram and linkedin post engagement",
    )),
    "sales": ("chat", "text", (
        "Write a cold email to prospects about our pricing and a follow-up email",
        "Prepare a sales pitch for the discovery call with the customer",
        "Handle these objections from the client about the renewal contract and quote",
    )),
    "design": ("chat", "text", (
        "Suggest a colour palette and typography for the user interface design system",
        "Review this wireframe layout for accessibility and visual hierarchy",
        "Create a style guide with fonts, icons and spacing for the mockups",
    )),
    "image": ("image", "image", (
        "a watercolor lighthouse at dawn",
        "product shot of a red sneaker on white",
    )),
    "video": ("video", "video", (
        "ten second clip of waves at sunset",
        "animated logo reveal",
    )),
    "embedding": ("embeddings", "text", (
        "quarterly report paragraph",
        "support ticket text",
    )),
    "general": ("chat", "text", (
        "What should I cook tonight with rice and beans?",
        "Give me three tips for a productive morning",
        "How far is the moon from the earth?",
    )),
}

# Device seconds one request costs on a speed-1.0 machine.
SERVICE_SECONDS: dict[str, float] = {
    "coding": 5.0, "research": 8.0, "marketing": 3.0, "sales": 3.0, "design": 4.0,
    "image": 20.0, "video": 90.0, "embedding": 0.3, "general": 3.0,
}


@dataclass(frozen=True, slots=True)
class Persona:
    name: str
    # (workload, weight) of this persona's requests.
    mix: tuple[tuple[str, float], ...]
    # Requests per active minute at a workday multiplier of 1.
    rate: float
    # Share of requests that name `named_model` instead of `auto`.
    named_share: float = 0.0
    named_model: str | None = None
    # Active only in this span of the day (fractions of the scenario); None: all day.
    window: tuple[float, float] | None = None
    # A workflow persona works in projects of ordered stages instead of a random mix: each
    # (workload, minute) is one request that many minutes into a project, under the project's own
    # affinity key; a new project starts every `rate`-th of an hour (staggered per user). Its
    # `mix` is the stages' share, for the population's average.
    workflow: tuple[tuple[str, int], ...] = ()

    def active(self, minute: int, minutes: int) -> bool:
        if self.window is None:
            return True
        return self.window[0] * minutes <= minute < self.window[1] * minutes


PERSONAS: tuple[Persona, ...] = (
    Persona("developer", (("coding", 0.75), ("research", 0.1), ("general", 0.15)), 0.5,
            named_share=0.3, named_model="coder-14b"),
    Persona("researcher", (("research", 0.7), ("embedding", 0.2), ("general", 0.1)), 0.4,
            named_share=0.2, named_model="research-32b"),
    Persona("marketer", (("marketing", 0.6), ("image", 0.25), ("video", 0.05), ("design", 0.1)), 0.4),
    Persona("seller", (("sales", 0.7), ("general", 0.2), ("marketing", 0.1)), 0.4),
    Persona("designer", (("design", 0.45), ("image", 0.4), ("video", 0.15)), 0.3),
    Persona("operations", (("general", 0.8), ("embedding", 0.2)), 0.5,
            named_share=0.6, named_model="general-8b"),
)
# How many users of each persona a population of 100 holds.
POPULATION_WEIGHTS: tuple[int, ...] = (30, 15, 15, 15, 10, 15)


# The full day's long tail: few users who name a model the general traffic rarely needs.
# An illustration sprint names the image model for about 50 minutes of the afternoon; a few
# researchers name the large research model all day.
LONG_TAIL: tuple[Persona, ...] = (
    Persona("illustrator", (("image", 1.0),), 0.8, named_share=0.9, named_model="image-xl", window=(0.64, 0.745)),
    Persona("scientist", (("research", 0.9), ("general", 0.1)), 0.5, named_share=0.9, named_model="research-32b"),
)
# Long-tail users per 50 users of the full day (each persona).
LONG_TAIL_PER_50 = 2

# The full day's campaign teams: every project makes a still image, then two minutes later
# animates it (image -> video), about twice an hour each. The sequence is what the forecaster's
# affinity learning can see coming: the video model it predicts after an image is the lab's
# predictive prefetch case.
CAMPAIGN = Persona("campaign", (("image", 0.5), ("video", 0.5)), 2.0,
                   workflow=(("image", 0), ("video", 2)), window=(0.1, 0.8))
# Campaign users per 50 users of the full day.
CAMPAIGN_PER_50 = 3


def full_day_population(users: int) -> tuple[Persona, ...]:
    """The classic proportions plus the long tail, `users` personas in all (the tail last)."""
    tail = [p for p in LONG_TAIL for _ in range(max(1, round(users * LONG_TAIL_PER_50 / 50)))]
    tail += [CAMPAIGN] * max(1, round(users * CAMPAIGN_PER_50 / 50))
    if users <= len(tail):
        raise ValueError(f"--users must exceed the full day's {len(tail)} long-tail users, got {users}")
    return population(users - len(tail)) + tuple(tail)


def population(users: int) -> tuple[Persona, ...]:
    """`users` personas in the fixed proportions, interleaved (deterministic)."""
    if users < 1:
        raise ValueError(f"--users must be at least 1, got {users}")
    total = sum(POPULATION_WEIGHTS)
    out: list[Persona] = []
    counts = [0] * len(PERSONAS)
    for i in range(users):
        # Largest deficit first: proportions hold at every prefix of the population.
        j = max(range(len(PERSONAS)), key=lambda k: ((i + 1) * POPULATION_WEIGHTS[k] / total - counts[k], -k))
        counts[j] += 1
        out.append(PERSONAS[j])
    return tuple(out)


@lru_cache(maxsize=512)
def classified(workload: str, template: int) -> tuple[str, str, str, int]:
    """(endpoint, modality, classified workload, input units) of one template, via the real classifier."""
    endpoint, modality, texts = TEMPLATES[workload]
    text = texts[template % len(texts)]
    c = classify(endpoint, text, modality)
    return endpoint, modality, c.workload, c.input_units
