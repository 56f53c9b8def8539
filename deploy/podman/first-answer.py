"""first-answer (docker-compose.yml, profile `ask`): the first chat through the TLS proxy.

Waits until the gateways list a model (the agent has fetched the bundled GGUF from the grid's
artifact store and its engine is ready), then sends one chat with the first client key of
GRID_GATEWAY_API_KEYS, verifying the proxy's certificate against GRID_TLS_CA, and prints the
answer. Exits 1 if no model is ready within GRID_WAIT_SECONDS (default 600).
"""

from __future__ import annotations

import os
import ssl
import sys
import time

import httpx


def main() -> int:
    url = os.environ.get("GRID_GATEWAY_URL", "https://gateway-tls:8443").rstrip("/")
    key = os.environ["GRID_GATEWAY_API_KEYS"].split(",")[0].strip()
    tls = ssl.create_default_context(cafile=os.environ.get("GRID_TLS_CA") or None)
    wait = float(os.environ.get("GRID_WAIT_SECONDS", "600"))
    headers = {"Authorization": f"Bearer {key}"}
    deadline = time.monotonic() + wait
    said = ""
    with httpx.Client(verify=tls, timeout=httpx.Timeout(10.0, read=300.0), trust_env=False) as client:
        while True:
            try:
                response = client.get(f"{url}/v1/models", headers=headers)
                models = [m["id"] for m in response.json().get("data", [])] if response.status_code == 200 else []
                state = f"HTTP {response.status_code}, models {models}"
            except (httpx.HTTPError, ValueError) as exc:
                models, state = [], f"{type(exc).__name__}: {exc}"
            if models:
                break
            if time.monotonic() > deadline:
                print(f"first-answer: no model ready at {url} within {wait:.0f}s ({state})", file=sys.stderr)
                return 1
            if state != said:
                print(f"first-answer: waiting for a model at {url} ({state})", file=sys.stderr, flush=True)
                said = state
            time.sleep(2.0)
        body = {"model": models[0], "max_tokens": 48,
                "messages": [{"role": "user", "content": "Say hello in one short sentence."}]}
        response = client.post(f"{url}/v1/chat/completions", headers=headers, json=body)
        if response.status_code != 200:
            print(f"first-answer: HTTP {response.status_code}: {response.text[:300]}", file=sys.stderr)
            return 1
        answer = response.json()["choices"][0]["message"]["content"]
        print(f"{models[0]}: {answer.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
