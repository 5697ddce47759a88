"""Readiness after ``/health``: the right model, a correct smoke answer, the installed
version."""

from __future__ import annotations

import re

from bot.core.phases.actions import BeginStep, Emit, EndStep, Phase, http
from bot.core.phases.common import HEALTH_REQUEST_TIMEOUT_S, http_why, journal_tail, read_version
from bot.core.plan import Step, readiness_command
from bot.core.readiness import (
    api_base,
    completion_body,
    completion_text,
    error_message,
    model_ids,
    reported_version,
)
from bot.core.versions import same_release
from bot.settings import ServiceSettings

READINESS_OF: dict[Step, Step] = {
    Step.HEALTH: Step.READINESS,
    Step.ROLLBACK_HEALTH: Step.ROLLBACK_READINESS,
}


class _NotReady(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def readiness_checks(svc: ServiceSettings, step: Step) -> Phase[str | None]:
    """``/health`` says the process is alive; this says it serves the configured model,
    answers the smoke prompt correctly and is the installed version. Each check's
    result goes in the step's output (the thread and the audit log). None when ready;
    else why not, handled like an unhealthy start."""
    yield Emit(BeginStep(step, readiness_command(svc)))
    checks: list[str] = []
    try:
        yield from _check_serving(svc, checks)
        yield from _check_version(svc, step, checks)
    except _NotReady as e:
        checks.append(f"FAILED: {e.reason}")
        journal = yield from journal_tail(step, svc)
        # The checks last, so that a tail (the thread's, the audit log's) keeps them.
        yield Emit(EndStep(step, False, e.reason, None, journal + "\n\n" + "\n".join(checks)))
        return f"not ready: {e.reason}"
    yield Emit(
        EndStep(
            step,
            True,
            f"{len(checks)} check(s) passed: " + "; ".join(c.split(": ", 1)[1] for c in checks),
            None,
            "\n".join(checks),
        )
    )
    return None


def serves(svc: ServiceSettings) -> Phase[str | None]:
    """The served model listed and, when configured, the smoke completion right: None
    when both hold, else why not (the watch window asks this every round)."""
    try:
        yield from _check_serving(svc, [])
    except _NotReady as e:
        return e.reason
    return None


def _check_serving(svc: ServiceSettings, checks: list[str]) -> Phase[None]:
    model = yield from _check_models(svc, checks)
    if svc.smoke_prompt is not None and model is not None:
        yield from _check_smoke(svc, svc.smoke_prompt, model, checks)


def _check_models(svc: ServiceSettings, checks: list[str]) -> Phase[str | None]:
    """``GET /v1/models`` lists ``served_model``; returns the model the smoke test asks
    (``served_model``, or the first listed), None when neither check is configured."""
    if svc.served_model is None and svc.smoke_prompt is None:
        return None
    url = f"{api_base(svc)}/v1/models"
    h = yield from http(url, HEALTH_REQUEST_TIMEOUT_S)
    ids = model_ids(h.body) if h.ok else None
    if ids is None:
        raise _NotReady(f"GET {url}: {http_why(h) if not h.ok else 'not a model list'}")
    if svc.served_model is None:
        if not ids:
            raise _NotReady(f"GET {url} lists no model")
        return ids[0]
    if svc.served_model not in ids:
        raise _NotReady(f"GET {url} lists {', '.join(ids) or 'no model'}, not {svc.served_model}")
    checks.append(f"ok: GET {url} lists {svc.served_model}")
    return svc.served_model


def _check_smoke(svc: ServiceSettings, prompt: str, model: str, checks: list[str]) -> Phase[None]:
    url = f"{api_base(svc)}/v1/completions"
    h = yield from http(
        url,
        svc.smoke_timeout_s,
        "POST",
        completion_body(model, prompt, svc.smoke_max_tokens),
        "application/json",
    )
    if h.status != 200:
        raise _NotReady(f"POST {url} (model {model}): {http_why(h)}")
    text = completion_text(h.body)
    if text is None:
        raise _NotReady(f"POST {url} answered 200 without a completion: {error_message(h.body)}")
    shown = repr(text[:120])
    if svc.smoke_expect is not None and not re.search(svc.smoke_expect, text):
        raise _NotReady(f"the smoke completion {shown} does not match {svc.smoke_expect!r}")
    if not text.strip():
        raise _NotReady(f"POST {url} answered an empty completion")
    matched = f", matches {svc.smoke_expect!r}" if svc.smoke_expect else ""
    checks.append(f"ok: POST {url} answered {shown}{matched}")


def _check_version(svc: ServiceSettings, step: Step, checks: list[str]) -> Phase[None]:
    url = f"{api_base(svc)}/version"
    h = yield from http(url, HEALTH_REQUEST_TIMEOUT_S)
    reported = reported_version(h.body) if h.ok else None
    if reported is None:
        checks.append(
            f"skipped: GET {url} reports no version "
            f"({http_why(h) if not h.ok else 'no version in the answer'})"
        )
        return
    installed, why, _ = yield from read_version(step, svc)
    if installed is None:
        checks.append(
            f"skipped: GET {url} reports {reported}; the installed version is unknown ({why})"
        )
        return
    if not same_release(reported, installed):
        raise _NotReady(
            f"the server reports version {reported}, but {svc.package} {installed} is installed"
        )
    # vLLM's own version has no `+cu129` label; the wheel's metadata has (versions.py).
    same = (
        "the installed version"
        if reported == installed
        else (f"the release of the installed {installed}")
    )
    checks.append(f"ok: GET {url} reports {reported}, {same}")
