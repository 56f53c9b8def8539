"""External engines: OpenAI-compatible endpoints Grid did not start, served as inventory only.

An operator registers an engine on the host where it runs (`gridctl engine add`); the
registration lives in the agent's state directory, owner-only, and names the endpoint's API key
by the path of a key file on this host (read when used, never copied into an event or a log).

Grid never owns these engines (safety invariant 7): nothing here starts, stops, signals, loads,
warms or drains one. The agent only probes each endpoint (`/v1/models` for every kind, plus
`/health` for llama.cpp), reports it in its heartbeat as a `managed=False` residency (ready while
the probe passes, failed with the reason in the heartbeat's warnings when it does not), and
forwards inference to it through the same responder as its own engines.

`--kind` selects only the probe endpoints. vLLM, Ollama and LM Studio are probed like any
OpenAI-compatible server; Grid cannot run them here and builds nothing that manages them.

`classify` is the pure decision from the probe's answers; `probe` and `probe_sync` do the I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec

from grid.events.host import Residency
from grid.secrets import SecretFileError, read_secret, write_owner_only

REGISTRY_FILE = "external-engines.json"

KIND_OPENAI = "openai"
KIND_LLAMA_CPP = "llama.cpp"
KIND_VLLM = "vllm"
KIND_OLLAMA = "ollama"
KIND_LMSTUDIO = "lmstudio"
KINDS = (KIND_OPENAI, KIND_LLAMA_CPP, KIND_VLLM, KIND_OLLAMA, KIND_LMSTUDIO)

# The kind's own health endpoint, probed beside /v1/models, where the kind has one we exercise.
HEALTH_PATHS: Mapping[str, str] = {KIND_LLAMA_CPP: "/health"}
MODELS_PATH = "/v1/models"

# Seconds between probes of every registered engine: a dead engine leaves routing within about
# one probe interval plus the probe timeout plus one heartbeat's trip through the log.
PROBE_INTERVAL_SECONDS = 1.0
PROBE_TIMEOUT_SECONDS = 1.5
# An engine that starts failing is most often restarting (an upgrade, a crash under a supervisor,
# a reload): it keeps being probed every interval for this long, so it is routed again within
# about one interval of answering instead of waiting out a backed-off probe.
PROBE_RECOVERY_WINDOW_SECONDS = 60.0
# Past the window the registration is more likely left behind for an engine that is gone: the
# wait between probes grows with the outage (this share of the time past the window), up to
# PROBE_BACKOFF_MAX_SECONDS. An engine that comes back is then routed within a tenth of its
# downtime, and a long-dead registration costs a probe every 30 s, not every second.
PROBE_BACKOFF_SHARE = 0.1
PROBE_BACKOFF_MAX_SECONDS = 30.0

# Why a probe passed or failed.
PROBE_OK = "ok"
PROBE_UNREACHABLE = "unreachable"
PROBE_TIMEOUT = "timeout"
PROBE_KEY_REFUSED = "api_key_refused"
PROBE_KEY_UNREADABLE = "api_key_file_unreadable"
PROBE_MODEL_NOT_LISTED = "model_not_listed"
PROBE_BAD_ANSWER = "bad_models_answer"
PROBE_UNHEALTHY = "health_check_failed"

# Why a registration was refused (beside a failed probe).
REG_BAD_URL = "bad_url"
REG_BAD_KIND = "bad_kind"
REG_BAD_MEMORY = "bad_memory"
REG_NOT_FOUND = "not_registered"


class Registration(msgspec.Struct, frozen=True, kw_only=True):
    model_id: str
    url: str  # the base URL, without a trailing /v1
    kind: str
    memory_mb: int = 0
    api_key_file: str | None = None  # an owner-only file on this host


class _Registry(msgspec.Struct, kw_only=True):
    engines: list[Registration] = msgspec.field(default_factory=list)


@dataclass(frozen=True)
class ProbeResult:
    reason: str
    detail: str = ""
    models: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.reason == PROBE_OK


@dataclass(frozen=True)
class RegistrationRefused:
    """An external engine's registration refused before any probe; `reason` is a REG_* constant."""

    reason: str
    message: str


# --- the registry file -------------------------------------------------------------------------


def registry_path(state_dir: Path) -> Path:
    return Path(state_dir) / REGISTRY_FILE


def load(state_dir: Path) -> list[Registration]:
    """The registered engines, in registration order ([] without a file; a damaged file reads
    as empty rather than stopping the agent, and `engine add` rewrites it whole)."""
    try:
        data = registry_path(state_dir).read_bytes()
    except FileNotFoundError:
        return []
    try:
        return list(msgspec.json.decode(data, type=_Registry).engines)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []


def save(state_dir: Path, engines: Sequence[Registration]) -> None:
    write_owner_only(registry_path(state_dir), msgspec.json.encode(_Registry(engines=list(engines))))


def base_url(url: str) -> str | RegistrationRefused:
    """The endpoint's base URL: http(s), no query, no trailing slash or /v1."""
    try:
        parsed = httpx.URL(url.strip())
    except httpx.InvalidURL as exc:
        return RegistrationRefused(REG_BAD_URL, f"{url!r} is not a URL: {exc}")
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return RegistrationRefused(REG_BAD_URL, f"{url!r} is not an http(s) URL with a host")
    if parsed.userinfo:
        return RegistrationRefused(REG_BAD_URL, "the URL must not carry credentials (it is reported in heartbeats): "
                                               "use --api-key-file")
    if parsed.query or parsed.fragment:
        return RegistrationRefused(REG_BAD_URL, f"{url!r}: give the base URL without a query or fragment")
    path = parsed.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return str(parsed.copy_with(path=path or "/")).rstrip("/")


def validate(model_id: str, url: str, kind: str, memory_mb: int,
             api_key_file: Path | None) -> Registration | RegistrationRefused:
    """A registration from an operator's arguments, before any probe."""
    if kind not in KINDS:
        return RegistrationRefused(REG_BAD_KIND, f"--kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if memory_mb < 0:
        return RegistrationRefused(REG_BAD_MEMORY, f"--memory-mb must be 0 or more, not {memory_mb}")
    base = base_url(url)
    if isinstance(base, RegistrationRefused):
        return base
    key_file = str(Path(api_key_file).resolve()) if api_key_file is not None else None
    return Registration(model_id=model_id, url=base, kind=kind, memory_mb=memory_mb, api_key_file=key_file)


def with_registration(engines: Sequence[Registration], reg: Registration) -> list[Registration]:
    """`engines` with `reg` added, replacing the registration of the same model (one per model:
    the responder routes a model's requests by its id)."""
    return [e for e in engines if e.model_id != reg.model_id] + [reg]


def without(engines: Sequence[Registration], target: str) -> tuple[list[Registration], list[Registration]]:
    """(kept, removed): `target` names a model id or a registered URL."""
    base = base_url(target)
    url = base if isinstance(base, str) else None
    removed = [e for e in engines if e.model_id == target or (url is not None and e.url == url)]
    return [e for e in engines if e not in removed], removed


def api_key(reg: Registration) -> str | None:
    """The endpoint's key, read from its owner-only file now (None: no key configured).
    Raises SecretFileError when the file is missing, empty or readable by others."""
    if reg.api_key_file is None:
        return None
    return read_secret(Path(reg.api_key_file))


# --- probing ------------------------------------------------------------------------------------


def listed_models(body: bytes) -> tuple[str, ...] | None:
    """The model ids of an OpenAI `/v1/models` answer (None: not that shape). Ollama and
    llama.cpp also answer a "models" list with "name"/"model" keys; those ids count too."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    ids: list[str] = []
    for key in ("data", "models"):
        items = doc.get(key)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict):
                    ids.extend(str(item[k]) for k in ("id", "name", "model") if isinstance(item.get(k), str))
    if not isinstance(doc.get("data"), list) and not isinstance(doc.get("models"), list):
        return None
    return tuple(dict.fromkeys(ids))


def classify(model_id: str, models_status: int, models_body: bytes, health_status: int | None) -> ProbeResult:
    """The verdict on one engine from its answers: `/v1/models` (status, body) and, for kinds
    with a health endpoint, that endpoint's status (None: the kind has none)."""
    if models_status in (401, 403):
        return ProbeResult(PROBE_KEY_REFUSED, f"{MODELS_PATH} answered {models_status}: the API key was refused")
    if models_status != 200:
        return ProbeResult(PROBE_BAD_ANSWER, f"{MODELS_PATH} answered {models_status}")
    models = listed_models(models_body)
    if models is None:
        return ProbeResult(PROBE_BAD_ANSWER, f"{MODELS_PATH} is not an OpenAI model list")
    if model_id not in models:
        shown = ", ".join(models[:8]) or "none"
        return ProbeResult(PROBE_MODEL_NOT_LISTED, f"the endpoint does not list {model_id!r} (it lists: {shown})",
                           models)
    if health_status is not None and health_status != 200:
        return ProbeResult(PROBE_UNHEALTHY, f"health endpoint answered {health_status}", models)
    return ProbeResult(PROBE_OK, "", models)


def _headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def _transport_failure(exc: httpx.HTTPError) -> ProbeResult:
    if isinstance(exc, httpx.TimeoutException):
        return ProbeResult(PROBE_TIMEOUT, f"no answer within {PROBE_TIMEOUT_SECONDS}s")
    return ProbeResult(PROBE_UNREACHABLE, type(exc).__name__)


def read_key(reg: Registration) -> tuple[str | None, ProbeResult | None]:
    """(key, None), or (None, why the key file cannot be used)."""
    try:
        return api_key(reg), None
    except (SecretFileError, OSError) as exc:
        return None, ProbeResult(PROBE_KEY_UNREADABLE, str(exc)[:200])


async def probe(http: httpx.AsyncClient, reg: Registration, key: str | None,
                timeout: float = PROBE_TIMEOUT_SECONDS) -> ProbeResult:
    try:
        models = await http.get(reg.url + MODELS_PATH, headers=_headers(key), timeout=timeout)
        health = None
        if (path := HEALTH_PATHS.get(reg.kind)) is not None and models.status_code == 200:
            health = (await http.get(reg.url + path, headers=_headers(key), timeout=timeout)).status_code
    except httpx.HTTPError as exc:
        return _transport_failure(exc)
    return classify(reg.model_id, models.status_code, models.content, health)


def probe_sync(reg: Registration, timeout: float = 5.0) -> ProbeResult:
    """The same probe, blocking (for `gridctl engine add`)."""
    key, failure = read_key(reg)
    if failure is not None:
        return failure
    try:
        with httpx.Client(trust_env=False, timeout=timeout) as http:
            models = http.get(reg.url + MODELS_PATH, headers=_headers(key))
            health = None
            if (path := HEALTH_PATHS.get(reg.kind)) is not None and models.status_code == 200:
                health = http.get(reg.url + path, headers=_headers(key)).status_code
    except httpx.HTTPError as exc:
        return _transport_failure(exc)
    return classify(reg.model_id, models.status_code, models.content, health)


# --- opt-in discovery: proposals only ----------------------------------------------------------

# Where the kinds listen by default on a machine's loopback.
WELL_KNOWN_PORTS: Mapping[int, str] = {8080: KIND_LLAMA_CPP, 8000: KIND_VLLM, 11434: KIND_OLLAMA, 1234: KIND_LMSTUDIO}


@dataclass(frozen=True)
class Proposal:
    """An OpenAI-compatible endpoint found on loopback: what `gridctl engine add` would register."""

    url: str
    kind: str
    reason: str  # PROBE_OK (models listed) or PROBE_KEY_REFUSED (it wants a key)
    models: tuple[str, ...] = ()
    registered: tuple[str, ...] = ()  # of `models`, those already registered here


def discover(ports: Mapping[int, str], registered: Sequence[Registration],
             timeout: float = 1.0) -> list[Proposal]:
    """Probe `/v1/models` on each loopback port (port -> kind) without a key; nothing is
    registered. A port that does not answer like an OpenAI server is left out."""
    found = []
    with httpx.Client(trust_env=False, timeout=timeout) as http:
        for port, kind in sorted(ports.items()):
            url = f"http://127.0.0.1:{port}"
            try:
                answer = http.get(url + MODELS_PATH)
            except httpx.HTTPError:
                continue
            if answer.status_code in (401, 403):
                found.append(Proposal(url, kind, PROBE_KEY_REFUSED))
                continue
            models = listed_models(answer.content) if answer.status_code == 200 else None
            if models is None:
                continue
            mine = tuple(m for m in models if any(r.url == url and r.model_id == m for r in registered))
            found.append(Proposal(url, kind, PROBE_OK, models, mine))
    return found


# --- what the agent knows about its external engines -------------------------------------------


@dataclass
class Observed:
    registration: Registration
    result: ProbeResult
    ready_since: float | None  # when the current run of passing probes began
    key: str | None = field(default=None, repr=False)  # the endpoint's key, held in memory only
    failing_since: float | None = None  # when the current run of failed probes began (None: passing)
    next_probe_at: float = 0.0


def probe_delay(failing_since: float | None, now: float) -> float:
    """Seconds from a probe at `now` to the next one of the same engine, whose failed probes began
    at `failing_since` (None: its probe passed). Every interval while it passes and through the
    first PROBE_RECOVERY_WINDOW_SECONDS of an outage; then growing with the outage, capped."""
    if failing_since is None:
        return PROBE_INTERVAL_SECONDS
    past_window = now - failing_since - PROBE_RECOVERY_WINDOW_SECONDS
    return min(PROBE_BACKOFF_MAX_SECONDS, max(PROBE_INTERVAL_SECONDS, past_window * PROBE_BACKOFF_SHARE))


@dataclass
class ExternalEngines:
    """The agent's latest probe of every registered engine (mutated only by `update`)."""

    state_dir: Path
    engines: dict[str, Observed] = field(default_factory=dict)

    def registrations(self) -> list[Registration]:
        return load(self.state_dir)

    def update(self, results: Sequence[tuple[Registration, ProbeResult, str | None]], now: float,
               kept: Mapping[str, Observed] | None = None) -> bool:
        """Record one round of probes (registration, result, key), keeping `kept` (engines not
        probed this round) as they were; True when anything a heartbeat reports changed."""
        before = {m: (o.registration, o.result.reason) for m, o in self.engines.items()}
        fresh: dict[str, Observed] = dict(kept or {})
        for reg, result, key in results:
            old = self.engines.get(reg.model_id)
            same = old is not None and old.registration == reg
            since = failing_since = None
            if result.ok:
                still_ready = same and old.result.ok
                since = old.ready_since if still_ready and old.ready_since is not None else now
            else:
                failing_since = old.failing_since if same and old.failing_since is not None else now
            fresh[reg.model_id] = Observed(reg, result, since, key, failing_since,
                                           now + probe_delay(failing_since, now))
        self.engines = fresh
        return before != {m: (o.registration, o.result.reason) for m, o in fresh.items()}

    def ready(self, model_id: str) -> Observed | None:
        """The engine serving `model_id` when its latest probe passed."""
        seen = self.engines.get(model_id)
        return seen if seen is not None and seen.result.ok else None

    def due(self, reg: Registration, now: float) -> bool:
        """Whether `reg` is probed in the round at `now`: a new or changed registration, an
        engine whose last probe passed, or a failing one whose wait (probe_delay) ran out."""
        seen = self.engines.get(reg.model_id)
        return seen is None or seen.registration != reg or seen.result.ok or now >= seen.next_probe_at

    async def probe_all(self, http: httpx.AsyncClient, now: float) -> bool:
        """Re-read the registry, probe every engine that is due at once, record the round; True
        on a change. An engine not due keeps its last result."""
        regs = self.registrations()
        due = [r for r in regs if self.due(r, now)]
        keys = [read_key(r) for r in due]
        results = await asyncio.gather(*(
            probe(http, r, key) if failure is None else _done(failure) for r, (key, failure) in zip(due, keys)
        ))
        probed = {r.model_id: (r, res, k) for r, res, (k, _) in zip(due, results, keys)}
        kept = {r.model_id: self.engines[r.model_id] for r in regs if r.model_id not in probed}
        return self.update(list(probed.values()), now, kept)


class WatchedEngineClient:
    """The agent's engine client (grid.infer.responder.EngineClient), telling the agent at once
    when a connect to an external engine fails, so it probes again now instead of at the next
    round and the engine leaves routing sooner. Requests are passed through unchanged."""

    def __init__(self, inner: Any, engines: ExternalEngines, on_refused: Callable[[], None]) -> None:
        self._inner = inner
        self._engines = engines
        self._on_refused = on_refused

    async def post(self, url: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
        try:
            return await self._inner.post(url, body, headers)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            if any(url.startswith(o.registration.url + "/") for o in self._engines.engines.values()):
                self._on_refused()
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _done(result: ProbeResult) -> ProbeResult:
    return result


def report(observed: Observed, now: float, active: int = 0) -> Residency:
    """One external engine as its heartbeat residency: never managed; an endpoint only while ready."""
    reg, ok = observed.registration, observed.result.ok
    return Residency(
        model_id=reg.model_id,
        memory_mb=reg.memory_mb,
        state="ready" if ok else "failed",
        managed=False,
        runtime=reg.kind,
        loaded_age_seconds=max(0.0, now - observed.ready_since) if ok and observed.ready_since is not None else None,
        active_requests=active,
        endpoint=reg.url if ok else None,
    )


def reports(engines: ExternalEngines, now: float) -> tuple[tuple[Residency, ...], tuple[str, ...]]:
    """Heartbeat residencies and warnings (why a failed engine is not routable), by model id."""
    residencies, warnings = [], []
    for model_id in sorted(engines.engines):
        o = engines.engines[model_id]
        residencies.append(report(o, now))
        if not o.result.ok:
            # The key file's problem names a local path (perhaps a user's home): only its reason
            # leaves the host; `gridctl engine ls` there shows the whole message.
            detail = "see `gridctl engine ls` on the host" if o.result.reason == PROBE_KEY_UNREADABLE \
                else o.result.detail
            warnings.append(f"external_engine_{o.result.reason}: {model_id} at {o.registration.url}: {detail}"[:300])
    return tuple(residencies), tuple(warnings)

