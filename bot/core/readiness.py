"""Model-level readiness of a vLLM server: the requests and what their answers mean.
Pure; ``bot.core.flows`` makes the requests through the SSH connection.

``/health`` answering 200 says the engine process is alive, not that it serves the
right model or correct answers. So after it: ``GET /v1/models`` must list the
configured ``served_model``; ``POST /v1/completions`` (temperature 0) must answer 200
with text matching ``smoke_expect``; and ``GET /version`` must report the installed
version when the server offers that endpoint (the same release, ``bot.core.versions``:
vLLM reports ``0.11.0`` for the wheel ``0.11.0+cu129``). The formats are vLLM's OpenAI-compatible
server's (``vllm/entrypoints/openai/protocol.py``: ``ModelList``, ``CompletionResponse``,
``ErrorResponse``; ``/version`` returns ``{"version": ...}``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

from bot.settings import ServiceSettings


def api_base(svc: ServiceSettings) -> str:
    """``api_url``, or ``health_url``'s scheme://host:port."""
    if svc.api_url:
        return svc.api_url.rstrip("/")
    parts = urlsplit(svc.health_url)
    return f"{parts.scheme}://{parts.netloc}"


def metrics_url(svc: ServiceSettings) -> str:
    return f"{api_base(svc)}/metrics"


def _json(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def model_ids(body: str) -> list[str] | None:
    """The ids a ``/v1/models`` answer lists; None when it is not a model list."""
    data = _json(body)
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        return None
    return [str(m["id"]) for m in data["data"] if isinstance(m, dict) and "id" in m]


def completion_body(model: str, prompt: str, max_tokens: int) -> bytes:
    """A deterministic completion request: temperature 0, no streaming."""
    return json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": False,
        }
    ).encode()


def completion_text(body: str) -> str | None:
    """The first choice's text of a ``/v1/completions`` answer; None when there is none."""
    data = _json(body)
    if not isinstance(data, dict):
        return None
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    text = choices[0].get("text")
    return text if isinstance(text, str) else None


def error_message(body: str, limit: int = 200) -> str:
    """What an error answer says: vLLM's ``{"message": ...}`` (or ``{"error": {...}}``),
    else the start of the body."""
    data = _json(body)
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        msg = inner.get("message") if isinstance(inner, dict) else None
        if isinstance(msg, str):
            return msg[:limit]
    return " ".join(body.split())[:limit] or "(empty body)"


def reported_version(body: str) -> str | None:
    data = _json(body)
    if isinstance(data, dict) and isinstance(data.get("version"), str):
        return str(data["version"])
    return None
