"""gridctl models | chat: talk to the running gateway like any OpenAI client would.

The gateway URL comes from --gateway, else GRID_GATEWAY_URL, else GRID_HOME/gateway.url
(written by the running gateway). A client key (when the gateway requires one) comes from
--api-key or GRID_API_KEY.
"""

from __future__ import annotations

import sys
from typing import Any

import httpx
import msgspec
import typer
from rich.table import Table

from grid.cli.common import JsonOption, config, console, fail, print_json

GatewayOption = typer.Option(
    None, "--gateway", envvar="GRID_GATEWAY_URL",
    help="Gateway URL, its root or the OpenAI base URL ending in /v1 (default: the one the running "
         "`gridctl up` recorded).",
)
ApiKeyOption = typer.Option(None, "--api-key", envvar="GRID_API_KEY", help="Client API key, if the gateway needs one.")


OPENAI_BASE_SUFFIX = "/v1"


def gateway_base(url: str) -> str:
    """The gateway's root from a URL a user may give: its root, or the OpenAI base URL it prints
    (`.../v1`, what OpenAI clients are configured with)."""
    base = url.strip().rstrip("/")
    return base.removesuffix(OPENAI_BASE_SUFFIX) if base.endswith(OPENAI_BASE_SUFFIX) else base


def resolve_gateway_url(explicit: str | None) -> str:
    if explicit:
        return gateway_base(explicit)
    recorded = config().home / "gateway.url"
    if recorded.exists():
        value = recorded.read_text().strip()
        if value:
            return gateway_base(value)
    fail(f"no gateway found: start one with `gridctl up`, or pass --gateway URL (looked for {recorded})")
    raise AssertionError  # unreachable


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _error_text(response: httpx.Response, body: bytes | None = None) -> str:
    data = body if body is not None else response.content
    try:
        err = msgspec.json.decode(data)["error"]
        text = f"{err.get('message')} ({err.get('code') or err.get('type')})"
    except Exception:  # not an OpenAI error body
        text = data[:300].decode("utf-8", errors="replace")
    retry = response.headers.get("retry-after")
    return f"HTTP {response.status_code}: {text}" + (f"; retry after {retry}s" if retry else "")


def models(
    gateway: str | None = GatewayOption,
    api_key: str | None = ApiKeyOption,
    json_out: bool = JsonOption,
) -> None:
    """List the models the gateway can serve right now (admitted READY replicas only)."""
    url = resolve_gateway_url(gateway)
    try:
        response = httpx.get(f"{url}/v1/models", headers=_headers(api_key), timeout=10.0, trust_env=False)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {url}: {exc}")
        return
    if response.status_code != 200:
        fail(_error_text(response))
    data: list[dict[str, Any]] = msgspec.json.decode(response.content).get("data", [])
    if json_out:
        print_json(data)
        return
    if not data:
        console.print("no model is ready yet (`gridctl chat -m auto ...` records demand for one)", style="dim")
        return
    table = Table("MODEL", "OWNED BY")
    for card in data:
        table.add_row(str(card.get("id")), str(card.get("owned_by", "")))
    console.print(table)


def chat(
    prompt: str = typer.Argument(..., help="The user message."),
    model: str = typer.Option("auto", "--model", "-m", help="Model id, or 'auto' to route by workload."),
    system: str | None = typer.Option(None, "--system", "-s", help="A system message."),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="Upper bound on generated tokens."),
    temperature: float | None = typer.Option(None, "--temperature"),
    affinity_key: str | None = typer.Option(
        None, "--affinity-key", help="Session key for X-Grid-Affinity-Key (keeps a session on one engine)."
    ),
    no_stream: bool = typer.Option(False, "--no-stream", help="Wait for the whole answer instead of streaming."),
    json_out: bool = typer.Option(False, "--json", help="Print the raw JSON response (implies --no-stream)."),
    gateway: str | None = GatewayOption,
    api_key: str | None = ApiKeyOption,
) -> None:
    """Send one chat message and stream the answer to the terminal."""
    url = resolve_gateway_url(gateway)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    body: dict[str, Any] = {"model": model, "messages": messages}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if temperature is not None:
        body["temperature"] = temperature
    stream = not (no_stream or json_out)
    if stream:
        body["stream"] = True
    headers = _headers(api_key)
    if affinity_key:
        headers["X-Grid-Affinity-Key"] = affinity_key
    timeout = httpx.Timeout(connect=10.0, read=600.0, write=30.0, pool=10.0)
    try:
        with httpx.Client(timeout=timeout, trust_env=False) as client:
            if not stream:
                response = client.post(f"{url}/v1/chat/completions", json=body, headers=headers)
                if response.status_code != 200:
                    fail(_error_text(response))
                data = msgspec.json.decode(response.content)
                if json_out:
                    print_json(data)
                else:
                    choices = data.get("choices") or [{}]
                    sys.stdout.write(str((choices[0].get("message") or {}).get("content") or "") + "\n")
                return
            with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as response:
                if response.status_code != 200:
                    fail(_error_text(response, response.read()))
                _print_stream(response)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {url}: {exc}")


def _print_stream(response: httpx.Response) -> None:
    wrote = False
    for line in response.iter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        try:
            chunk = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            continue
        if isinstance(chunk, dict) and "error" in chunk:
            sys.stdout.write("\n")
            fail(str(chunk["error"].get("message") if isinstance(chunk["error"], dict) else chunk["error"]))
        for choice in (chunk.get("choices") or []) if isinstance(chunk, dict) else []:
            text = (choice.get("delta") or {}).get("content")
            if text:
                sys.stdout.write(text)
                sys.stdout.flush()
                wrote = True
    if wrote:
        sys.stdout.write("\n")
        sys.stdout.flush()


def register(app: typer.Typer) -> None:
    """Add `gridctl models` and `gridctl chat` to the main app."""
    app.command("models")(models)
    app.command("chat")(chat)
