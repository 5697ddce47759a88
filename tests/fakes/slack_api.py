"""A fake Slack, faked only at its HTTP/WebSocket boundary.

Point the real `slack_sdk.web.async_client.AsyncWebClient(base_url=fake.base_url)` (and the
bolt apps built on it) at this server. slack_sdk joins `base_url` and the method name with
`urljoin`, so `base_url` ends with `/api/`.

What is modelled, and why it matters to the bot:
- the Web API envelope: HTTP 200 with `{"ok": ...}`, errors as `{"ok": false, "error": ...}`,
  auth through `Authorization: Bearer` (or a `token` arg), bodies as query string, form,
  multipart or JSON (slack_sdk sends chat.* as JSON and most other methods as query params);
- messages stored per channel with threads and edit history, ephemerals per user, files;
- Slack's documented limits that turn a post into an error (blocks) or a warning
  (text over 40,000 chars is truncated and `message_truncated` is returned);
- per-channel pacing of chat.postMessage (Slack allows about one message per second per
  channel with short bursts) answered like Slack: HTTP 429, `Retry-After` in whole seconds
  (slack_sdk's AsyncRateLimitErrorRetryHandler parses it with `int()`);
- faults: a global 429 window, injected errors, and the whole API going down and coming back
  on the same port (slack_sdk's AsyncConnectionErrorRetryHandler retries ClientOSError, which
  covers connection refused and reset);
- `response_url`s that behave like Slack's (ephemeral, in_channel, replace/delete original);
- Socket Mode via `apps.connections.open` (see socket_mode.py).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

from .slack_requests import (
    DEFAULT_APP_ID,
    DEFAULT_CHANNEL_ID,
    DEFAULT_TEAM_ID,
    DEFAULT_USER_ID,
    block_actions_payload,
    slash_command_payload,
)
from .socket_mode import LINK_PATH, ChangeSignal, FakeSocketMode

JsonDict = dict[str, Any]

MAX_TEXT_CHARS = 40_000
MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3_000
MAX_SECTION_FIELDS = 10
MAX_FIELD_TEXT = 2_000
MAX_HEADER_TEXT = 150
MAX_MARKDOWN_TOTAL = 12_000
MAX_CONTEXT_ELEMENTS = 10
MAX_ACTIONS_ELEMENTS = 25
MAX_BUTTON_TEXT = 75
MAX_BUTTON_VALUE = 2_000
MAX_ID_CHARS = 255
KNOWN_BLOCK_TYPES = frozenset(
    {
        "actions",
        "context",
        "divider",
        "file",
        "header",
        "image",
        "input",
        "markdown",
        "rich_text",
        "section",
        "table",
        "video",
    }
)


@dataclass(frozen=True)
class ApiCall:
    """One Web API request as the fake saw it, with what it answered."""

    method: str
    params: JsonDict  # query string + form fields
    json: JsonDict | None  # JSON body, when the client sent one
    token: str | None
    at: float  # the fake's clock
    status: int
    response: JsonDict

    @property
    def args(self) -> JsonDict:
        """All arguments merged the way Slack reads them."""
        return {**self.params, **(self.json or {})}

    @property
    def ok(self) -> bool:
        return bool(self.response.get("ok"))

    @property
    def error(self) -> str | None:
        err = self.response.get("error")
        return str(err) if err is not None else None


@dataclass
class UploadedFile:
    id: str
    filename: str
    length: int
    content: bytes | None = None
    title: str | None = None
    # (channel, thread_ts or None, ts of the message that shares it)
    shares: list[tuple[str, str | None, str]] = field(default_factory=list)

    @property
    def text(self) -> str:
        if self.content is None:
            raise AssertionError(f"file {self.id} was never uploaded")
        return self.content.decode()


@dataclass(frozen=True)
class ResponseUrlPost:
    key: str
    channel: str
    user: str
    body: JsonDict


@dataclass(frozen=True)
class _ResponseTarget:
    channel: str
    user: str
    message_ts: str | None


@dataclass
class _Fault:
    error: str
    status: int
    retry_after: int | None


@dataclass
class _Bucket:
    tokens: float
    updated: float


class SlackApiFault(Exception):
    """An error answer; raised inside method handlers and turned into the response."""

    def __init__(
        self,
        error: str,
        *,
        status: int = 200,
        extra: JsonDict | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.error = error
        self.status = status
        self.extra = extra or {}
        self.headers = dict(headers or {})


def _form_bytes(value: bytes | bytearray | web.FileField) -> bytes:
    if isinstance(value, web.FileField):
        return value.file.read()
    return bytes(value)


def _text_of(obj: Any) -> str:
    if isinstance(obj, Mapping):
        value = obj.get("text")
        return value if isinstance(value, str) else ""
    return ""


def _validate_text_object(
    obj: Any, where: str, errors: list[str], *, max_len: int, plain_only: bool = False
) -> None:
    if not isinstance(obj, Mapping) or not isinstance(obj.get("text"), str):
        errors.append(f"missing required field: text [json-pointer:{where}]")
        return
    allowed = ("plain_text",) if plain_only else ("plain_text", "mrkdwn")
    if obj.get("type") not in allowed:
        errors.append(f"must be one of {list(allowed)} [json-pointer:{where}/type]")
    text = obj["text"]
    if not text:
        errors.append(f"must be more than 0 characters [json-pointer:{where}/text]")
    elif len(text) > max_len:
        errors.append(f"must be less than {max_len + 1} characters [json-pointer:{where}/text]")


def _validate_elements(elements: Any, where: str, errors: list[str], *, max_items: int) -> None:
    if not isinstance(elements, list) or not elements:
        errors.append(f"must provide at least 1 item [json-pointer:{where}]")
        return
    if len(elements) > max_items:
        errors.append(f"no more than {max_items} items allowed [json-pointer:{where}]")
    seen: set[str] = set()
    for j, element in enumerate(elements):
        _validate_interactive(element, f"{where}/{j}", errors, seen)


def _validate_interactive(element: Any, where: str, errors: list[str], seen: set[str]) -> None:
    if not isinstance(element, Mapping):
        errors.append(f"must be an object [json-pointer:{where}]")
        return
    action_id = element.get("action_id")
    if isinstance(action_id, str):
        if len(action_id) > MAX_ID_CHARS:
            errors.append(f"must be less than 256 characters [json-pointer:{where}/action_id]")
        if action_id in seen:
            errors.append(f"action_id must be unique [json-pointer:{where}/action_id]")
        seen.add(action_id)
    if element.get("type") == "button":
        _validate_text_object(
            element.get("text"), f"{where}/text", errors, max_len=MAX_BUTTON_TEXT, plain_only=True
        )
        value = element.get("value")
        if isinstance(value, str) and len(value) > MAX_BUTTON_VALUE:
            errors.append(f"must be less than 2001 characters [json-pointer:{where}/value]")


def validate_blocks(blocks: list[Any]) -> list[str]:
    """Slack's block-kit schema errors for the limits the bot can hit, json-pointer style."""
    errors: list[str] = []
    if len(blocks) > MAX_BLOCKS:
        errors.append(f"no more than {MAX_BLOCKS} items allowed [json-pointer:/blocks]")
    markdown_total = 0
    for i, block in enumerate(blocks):
        where = f"/blocks/{i}"
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            errors.append(f"missing required field: type [json-pointer:{where}]")
            continue
        kind = block["type"]
        if kind not in KNOWN_BLOCK_TYPES:
            errors.append(f"failed to match all allowed schemas [json-pointer:{where}]")
            continue
        block_id = block.get("block_id")
        if isinstance(block_id, str) and len(block_id) > MAX_ID_CHARS:
            errors.append(f"must be less than 256 characters [json-pointer:{where}/block_id]")
        if kind == "section":
            fields = block.get("fields")
            if "text" not in block and not fields:
                errors.append(f"must provide either text or fields [json-pointer:{where}]")
            if "text" in block:
                _validate_text_object(
                    block["text"], f"{where}/text", errors, max_len=MAX_SECTION_TEXT
                )
            if isinstance(fields, list):
                if len(fields) > MAX_SECTION_FIELDS:
                    errors.append(f"no more than 10 items allowed [json-pointer:{where}/fields]")
                for j, f in enumerate(fields):
                    _validate_text_object(f, f"{where}/fields/{j}", errors, max_len=MAX_FIELD_TEXT)
            if "accessory" in block:
                _validate_interactive(block["accessory"], f"{where}/accessory", errors, set())
        elif kind == "header":
            _validate_text_object(
                block.get("text"), f"{where}/text", errors, max_len=MAX_HEADER_TEXT, plain_only=True
            )
        elif kind == "context":
            elements = block.get("elements")
            if not isinstance(elements, list) or not elements:
                errors.append(f"must provide at least 1 item [json-pointer:{where}/elements]")
            elif len(elements) > MAX_CONTEXT_ELEMENTS:
                errors.append(f"no more than 10 items allowed [json-pointer:{where}/elements]")
        elif kind == "actions":
            _validate_elements(
                block.get("elements"), f"{where}/elements", errors, max_items=MAX_ACTIONS_ELEMENTS
            )
        elif kind == "markdown":
            markdown_total += len(_text_of(block))
    if markdown_total > MAX_MARKDOWN_TOTAL:
        errors.append("cumulative markdown block text must be less than 12001 characters")
    return errors


class FakeSlack:
    """Fake Slack Web API + response_urls + Socket Mode on one aiohttp server (127.0.0.1:0)."""

    def __init__(
        self,
        *,
        bot_token: str = "xoxb-fake-bot-token",
        app_token: str = "xapp-1-A0FAKE-1-fake-app-token",
        team_id: str = DEFAULT_TEAM_ID,
        team: str = "Fake Team",
        team_domain: str = "fake-team",
        bot_user_id: str = "U0BOT",
        bot_name: str = "vllm-chatops",
        bot_id: str = "B0BOT",
        app_id: str = DEFAULT_APP_ID,
        channels: Iterable[str] | None = None,
        usergroups: Mapping[str, Iterable[str]] | None = None,
        users: Mapping[str, str] | None = None,
        post_rate_per_s: float | None = 1.0,
        post_burst: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bot_token = bot_token
        self.app_token = app_token
        self.team_id = team_id
        self.team = team
        self.team_domain = team_domain
        self.bot_user_id = bot_user_id
        self.bot_name = bot_name
        self.bot_id = bot_id
        self.app_id = app_id
        # None accepts every channel id; a set makes others `channel_not_found`.
        self.channels: set[str] | None = set(channels) if channels is not None else None
        self.usergroups: dict[str, list[str]] = {k: list(v) for k, v in (usergroups or {}).items()}
        # None answers users.info for any id; a mapping (id -> name) restricts it.
        self.users: dict[str, str] | None = dict(users) if users is not None else None
        # chat.postMessage pacing per channel; None disables it.
        self.post_rate_per_s = post_rate_per_s
        self.post_burst = post_burst
        self.clock = clock
        # A POST to an upload URL larger than this answers 413, as files.slack.com does past
        # its limit (1 GB there; tests set a small one). None: only aiohttp's 64 MiB cap.
        self.max_upload_bytes: int | None = None

        self.signal = ChangeSignal()
        self.socket_mode = FakeSocketMode(app_id=app_id, signal=self.signal)

        self._calls: list[ApiCall] = []
        self._channel_messages: dict[str, list[JsonDict]] = {}
        self._by_ts: dict[tuple[str, str], JsonDict] = {}
        self._versions: dict[tuple[str, str], list[JsonDict]] = {}
        self._ephemerals: list[JsonDict] = []
        self._files: dict[str, UploadedFile] = {}
        self.responses: list[ResponseUrlPost] = []
        self._response_targets: dict[str, _ResponseTarget] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._faults: dict[str, deque[_Fault]] = {}
        self._rate_limited_until: float | None = None
        self._rate_limit_retry_after = 1
        self._ts_seq = itertools.count(1)
        self._ids = itertools.count(1)
        self._ts_base = 1_700_000_000

        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.port = 0
        self._handlers: dict[str, Callable[[JsonDict], JsonDict]] = {
            "api.test": self._api_test,
            "auth.test": self._auth_test,
            "chat.postMessage": self._chat_post_message,
            "chat.update": self._chat_update,
            "chat.postEphemeral": self._chat_post_ephemeral,
            "chat.getPermalink": self._chat_get_permalink,
            "usergroups.users.list": self._usergroups_users_list,
            "users.info": self._users_info,
            "files.getUploadURLExternal": self._files_get_upload_url_external,
            "files.completeUploadExternal": self._files_complete_upload_external,
            "apps.connections.open": self._apps_connections_open,
        }

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/api/{method}", self._handle_api)
        app.router.add_post("/upload/v1/{file_id}", self._handle_upload)
        app.router.add_post("/response_url/{key}", self._handle_response_url)
        app.router.add_get(LINK_PATH, self.socket_mode.handle)
        # A short shutdown timeout: a client that keeps a request open must not stall teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is None:
            return
        await self.socket_mode.close_all()
        await self._runner.cleanup()
        self._runner = None
        self._site = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/api/"

    @property
    def ws_base(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def is_up(self) -> bool:
        return self._site is not None

    async def down(self) -> None:
        """Stop listening and reset open connections: clients see refused/reset errors."""
        if self._runner is None or self._site is None:
            return
        await self._site.stop()
        self._site = None
        server = self._runner.server
        if server is not None:
            for handler in list(server.connections):
                if handler.transport is not None:
                    handler.transport.abort()

    async def up(self) -> None:
        """Listen again on the same port."""
        if self._runner is None or self._site is not None:
            return
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await self._site.start()

    # ------------------------------------------------------------------ faults

    def rate_limit_all(self, seconds: float, *, retry_after: int = 1) -> None:
        """Every Web API call answers 429 until `seconds` have passed on the fake's clock."""
        self._rate_limited_until = self.clock() + seconds
        self._rate_limit_retry_after = retry_after

    def fail_next(
        self,
        method: str,
        error: str = "internal_error",
        *,
        status: int = 200,
        retry_after: int | None = None,
        count: int = 1,
    ) -> None:
        """The next `count` calls of `method` ("*" for any) answer `error` with `status`."""
        if status == 429 and retry_after is None:
            retry_after = 1
        queue = self._faults.setdefault(method, deque())
        queue.extend(_Fault(error, status, retry_after) for _ in range(count))

    # ------------------------------------------------------------------ inspection

    def calls(self, method: str | None = None) -> list[ApiCall]:
        return [c for c in self._calls if method is None or c.method == method]

    def messages(self, channel: str) -> list[JsonDict]:
        """Everything posted in the channel (top level and replies), oldest first."""
        return copy.deepcopy(self._channel_messages.get(channel, []))

    def top_level(self, channel: str) -> list[JsonDict]:
        return [m for m in self.messages(channel) if m.get("thread_ts") in (None, m["ts"])]

    def message(self, channel: str, ts: str) -> JsonDict:
        try:
            return copy.deepcopy(self._by_ts[(channel, ts)])
        except KeyError:
            raise AssertionError(f"no message {ts} in {channel}") from None

    def thread(self, channel: str, thread_ts: str) -> list[JsonDict]:
        """The parent and its replies, oldest first."""
        return [
            m
            for m in self.messages(channel)
            if m["ts"] == thread_ts or m.get("thread_ts") == thread_ts
        ]

    def message_versions(self, channel: str, ts: str) -> list[JsonDict]:
        """Each state of a message: as posted, then after every chat.update."""
        return copy.deepcopy(self._versions.get((channel, ts), []))

    def ephemerals(self, *, channel: str | None = None, user: str | None = None) -> list[JsonDict]:
        return [
            copy.deepcopy(e)
            for e in self._ephemerals
            if (channel is None or e["channel"] == channel) and (user is None or e["user"] == user)
        ]

    @property
    def files(self) -> list[UploadedFile]:
        return list(self._files.values())

    def file(self, file_id: str) -> UploadedFile:
        return self._files[file_id]

    # ------------------------------------------------------------------ waiting

    async def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition"
    ) -> None:
        await self.signal.wait_for(predicate, timeout=timeout, what=what)

    async def wait_for_call(self, method: str, *, count: int = 1, timeout: float = 5.0) -> ApiCall:
        """Wait until `method` has been called `count` times; returns the count-th call."""
        await self.wait_for(
            lambda: len(self.calls(method)) >= count, timeout=timeout, what=f"{count}x {method}"
        )
        return self.calls(method)[count - 1]

    async def wait_for_message(
        self,
        channel: str,
        predicate: Callable[[JsonDict], bool] = lambda _m: True,
        *,
        timeout: float = 5.0,
    ) -> JsonDict:
        def found() -> JsonDict | None:
            return next((m for m in self.messages(channel) if predicate(m)), None)

        await self.wait_for(lambda: found() is not None, timeout=timeout, what=f"msg in {channel}")
        result = found()
        assert result is not None
        return result

    async def wait_for_response(self, *, count: int = 1, timeout: float = 5.0) -> ResponseUrlPost:
        await self.wait_for(
            lambda: len(self.responses) >= count,
            timeout=timeout,
            what=f"{count} response_url post(s)",
        )
        return self.responses[count - 1]

    # ------------------------------------------------------------------ inbound builders

    def new_response_url(self, channel: str, user: str, *, message_ts: str | None = None) -> str:
        key = uuid.uuid4().hex
        self._response_targets[key] = _ResponseTarget(channel, user, message_ts)
        return f"{self.url}/response_url/{key}"

    def slash_command(
        self,
        text: str,
        *,
        command: str = "/vllm",
        user_id: str = DEFAULT_USER_ID,
        channel_id: str = DEFAULT_CHANNEL_ID,
        **extra: str,
    ) -> dict[str, str]:
        """A slash-command payload whose response_url lands on this fake."""
        return slash_command_payload(
            text,
            command=command,
            user_id=user_id,
            channel_id=channel_id,
            team_id=self.team_id,
            api_app_id=self.app_id,
            response_url=self.new_response_url(channel_id, user_id),
            **extra,
        )

    def block_action(
        self,
        action_id: str,
        value: str,
        *,
        channel_id: str,
        message_ts: str,
        user_id: str = DEFAULT_USER_ID,
        **extra: Any,
    ) -> JsonDict:
        """A click on a button of a message the bot posted here (blocks taken from the store)."""
        return block_actions_payload(
            action_id=action_id,
            value=value,
            message=self.message(channel_id, message_ts),
            user_id=user_id,
            channel_id=channel_id,
            team_id=self.team_id,
            api_app_id=self.app_id,
            response_url=self.new_response_url(channel_id, user_id, message_ts=message_ts),
            **extra,
        )

    def add_message(
        self, channel: str, text: str, *, user: str = DEFAULT_USER_ID, thread_ts: str | None = None
    ) -> str:
        """Seed a message from a human (the bot cannot chat.update it)."""
        msg: JsonDict = {"type": "message", "user": user, "text": text, "team": self.team_id}
        return str(self._store_message(channel, msg, thread_ts)["ts"])

    # ------------------------------------------------------------------ HTTP handlers

    def _reply(
        self, body: JsonDict, *, status: int = 200, headers: Mapping[str, str] | None = None
    ) -> web.Response:
        all_headers = {"X-Slack-Req-Id": uuid.uuid4().hex, **(headers or {})}
        return web.json_response(body, status=status, headers=all_headers)

    async def _read_args(self, request: web.Request) -> tuple[JsonDict, JsonDict | None]:
        params: JsonDict = dict(request.query)
        body_json: JsonDict | None = None
        if request.content_type == "application/json":
            raw = await request.text()
            if raw:
                try:
                    parsed = json.loads(raw)
                except ValueError:
                    raise SlackApiFault("invalid_json") from None
                if not isinstance(parsed, dict):
                    raise SlackApiFault("invalid_json")
                body_json = parsed
        elif request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
            form = await request.post()
            for key, value in form.items():
                params[key] = value if isinstance(value, str) else _form_bytes(value)
        return params, body_json

    def _auth(self, method: str, token: str | None) -> None:
        if not token:
            raise SlackApiFault("not_authed")
        wanted = self.app_token if method == "apps.connections.open" else self.bot_token
        if token == wanted:
            return
        if token in (self.app_token, self.bot_token):
            raise SlackApiFault("not_allowed_token_type")
        raise SlackApiFault("invalid_auth")

    def _infra_fault(self, method: str) -> SlackApiFault | None:
        if self._rate_limited_until is not None:
            if self.clock() < self._rate_limited_until:
                return SlackApiFault(
                    "ratelimited",
                    status=429,
                    headers={"Retry-After": str(self._rate_limit_retry_after)},
                )
            self._rate_limited_until = None
        for key in (method, "*"):
            queue = self._faults.get(key)
            if queue:
                fault = queue.popleft()
                headers = (
                    {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
                )
                return SlackApiFault(fault.error, status=fault.status, headers=headers)
        return None

    async def _handle_api(self, request: web.Request) -> web.Response:
        method = request.match_info["method"]
        params: JsonDict = {}
        body_json: JsonDict | None = None
        token: str | None = None
        status = 200
        headers: dict[str, str] = {}
        try:
            params, body_json = await self._read_args(request)
            args = {**params, **(body_json or {})}
            auth = request.headers.get("Authorization", "")
            token = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else None
            if token is None and isinstance(args.get("token"), str):
                token = args["token"]
            args.pop("token", None)
            fault = self._infra_fault(method)
            if fault is not None:
                raise fault
            handler = self._handlers.get(method)
            if handler is None:
                raise SlackApiFault("unknown_method", extra={"req_method": method})
            self._auth(method, token)
            body: JsonDict = {"ok": True, **handler(args)}
        except SlackApiFault as e:
            status = e.status
            headers = e.headers
            body = {"ok": False, "error": e.error, **e.extra}
        self._calls.append(
            ApiCall(
                method=method,
                params=params,
                json=body_json,
                token=token,
                at=self.clock(),
                status=status,
                response=body,
            )
        )
        self.signal.notify()
        return self._reply(body, status=status, headers=headers)

    async def _handle_upload(self, request: web.Request) -> web.Response:
        upload = self._files.get(request.match_info["file_id"])
        if upload is None:
            return web.Response(status=404, text="not found")
        if request.content_type == "multipart/form-data":
            form = await request.post()
            part = form.get("file") or next(iter(form.values()), b"")
            upload.content = part.encode() if isinstance(part, str) else _form_bytes(part)
        else:
            upload.content = await request.read()
        if self.max_upload_bytes is not None and len(upload.content) > self.max_upload_bytes:
            upload.content = None
            return web.Response(
                status=413, text="Request Entity Too Large", content_type="text/plain"
            )
        self.signal.notify()
        return web.Response(text=f"OK - {len(upload.content)}", content_type="text/plain")

    async def _handle_response_url(self, request: web.Request) -> web.Response:
        key = request.match_info["key"]
        target = self._response_targets.get(key)
        if target is None:
            return web.Response(status=404, text="expired_url")
        try:
            body = await request.json()
        except ValueError:
            return web.Response(status=400, text="invalid_payload")
        self.responses.append(ResponseUrlPost(key, target.channel, target.user, body))
        try:
            self._apply_response(target, body)
        except SlackApiFault as e:
            self.signal.notify()
            return web.Response(status=400, text=e.error)
        self.signal.notify()
        return web.Response(text="ok", content_type="text/plain")

    def _apply_response(self, target: _ResponseTarget, body: JsonDict) -> None:
        original = self._by_ts.get((target.channel, target.message_ts or ""))
        if body.get("delete_original") and original is not None:
            self._channel_messages[target.channel].remove(original)
            del self._by_ts[(target.channel, original["ts"])]
            return
        text, blocks, attachments, warnings = self._content(body, limit_text=True)
        if body.get("replace_original") and original is not None:
            self._edit(target.channel, original, text, blocks)
            return
        if body.get("response_type") == "in_channel":
            msg = self._bot_message(text, blocks, attachments)
            self._store_message(target.channel, msg, body.get("thread_ts"))
            return
        self._ephemerals.append(
            {
                "channel": target.channel,
                "user": target.user,
                "text": text,
                "blocks": blocks,
                "thread_ts": body.get("thread_ts"),
                "message_ts": self._next_ts(),
                "via": "response_url",
                "warnings": warnings,
            }
        )

    # ------------------------------------------------------------------ storage helpers

    def _next_ts(self) -> str:
        seq = next(self._ts_seq)
        return f"{self._ts_base + seq}.{seq % 1_000_000:06d}"

    def _next_id(self, prefix: str) -> str:
        return f"{prefix}{next(self._ids):08d}"

    def _channel(self, args: JsonDict, key: str = "channel") -> str:
        channel = args.get(key)
        if not isinstance(channel, str) or not channel:
            raise SlackApiFault("channel_not_found")
        if self.channels is not None and channel not in self.channels:
            raise SlackApiFault("channel_not_found")
        return channel

    def _content(
        self, args: JsonDict, *, limit_text: bool
    ) -> tuple[str, list[Any] | None, list[Any] | None, list[str]]:
        """(text, blocks, attachments, warnings) from a post; `no_text` when all are empty."""
        raw_blocks = args.get("blocks")
        blocks: list[Any] | None = None
        if raw_blocks is not None:
            if isinstance(raw_blocks, str):
                try:
                    raw_blocks = json.loads(raw_blocks)
                except ValueError:
                    raise SlackApiFault("invalid_blocks_format") from None
            if not isinstance(raw_blocks, list):
                raise SlackApiFault("invalid_blocks_format")
            errors = validate_blocks(raw_blocks)
            if errors:
                raise SlackApiFault(
                    "invalid_blocks",
                    extra={
                        "errors": errors,
                        "response_metadata": {"messages": [f"[ERROR] {e}" for e in errors]},
                    },
                )
            blocks = raw_blocks
        raw_attachments = args.get("attachments")
        attachments: list[Any] | None = None
        if isinstance(raw_attachments, str):
            try:
                raw_attachments = json.loads(raw_attachments)
            except ValueError:
                raise SlackApiFault("invalid_attachments") from None
        if isinstance(raw_attachments, list):
            attachments = raw_attachments
        text = args.get("text")
        text = text if isinstance(text, str) else ""
        if not text and not blocks and not attachments:
            raise SlackApiFault("no_text")
        warnings: list[str] = []
        if len(text) > MAX_TEXT_CHARS:
            if not limit_text:
                raise SlackApiFault("msg_too_long")
            # Slack posts the first 40,000 characters and says so in a warning.
            text = text[:MAX_TEXT_CHARS]
            warnings.append("message_truncated")
        return text, blocks, attachments, warnings

    def _bot_message(
        self, text: str, blocks: list[Any] | None, attachments: list[Any] | None
    ) -> JsonDict:
        msg: JsonDict = {
            "type": "message",
            "subtype": "bot_message",
            "user": self.bot_user_id,
            "bot_id": self.bot_id,
            "app_id": self.app_id,
            "team": self.team_id,
            "text": text,
        }
        if blocks is not None:
            msg["blocks"] = blocks
        if attachments is not None:
            msg["attachments"] = attachments
        return msg

    def _store_message(self, channel: str, msg: JsonDict, thread_ts: Any) -> JsonDict:
        msg["ts"] = self._next_ts()
        if isinstance(thread_ts, str) and thread_ts:
            msg["thread_ts"] = thread_ts
            parent = self._by_ts.get((channel, thread_ts))
            if parent is not None:
                msg["parent_user_id"] = parent.get("user")
                parent["thread_ts"] = thread_ts
                parent["reply_count"] = int(parent.get("reply_count", 0)) + 1
                parent["latest_reply"] = msg["ts"]
        self._channel_messages.setdefault(channel, []).append(msg)
        self._by_ts[(channel, msg["ts"])] = msg
        self._versions[(channel, msg["ts"])] = [copy.deepcopy(msg)]
        return msg

    def _edit(
        self, channel: str, msg: JsonDict, text: str | None, blocks: list[Any] | None
    ) -> None:
        if text is not None:
            msg["text"] = text
        if blocks is not None:
            msg["blocks"] = blocks
        msg["edited"] = {"user": self.bot_user_id, "ts": self._next_ts()}
        self._versions[(channel, msg["ts"])].append(copy.deepcopy(msg))

    def _pace(self, channel: str) -> None:
        if self.post_rate_per_s is None:
            return
        now = self.clock()
        bucket = self._buckets.setdefault(channel, _Bucket(float(self.post_burst), now))
        bucket.tokens = min(
            float(self.post_burst), bucket.tokens + (now - bucket.updated) * self.post_rate_per_s
        )
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        wait = (1.0 - bucket.tokens) / self.post_rate_per_s
        raise SlackApiFault(
            "ratelimited", status=429, headers={"Retry-After": str(max(1, math.ceil(wait)))}
        )

    # ------------------------------------------------------------------ Web API methods

    def _api_test(self, args: JsonDict) -> JsonDict:
        return {"args": {k: v for k, v in args.items() if isinstance(v, str)}}

    def _auth_test(self, _args: JsonDict) -> JsonDict:
        return {
            "url": f"https://{self.team_domain}.slack.com/",
            "team": self.team,
            "user": self.bot_name,
            "team_id": self.team_id,
            "user_id": self.bot_user_id,
            "bot_id": self.bot_id,
            "is_enterprise_install": False,
        }

    def _chat_post_message(self, args: JsonDict) -> JsonDict:
        channel = self._channel(args)
        self._pace(channel)
        text, blocks, attachments, warnings = self._content(args, limit_text=True)
        msg = self._store_message(
            channel, self._bot_message(text, blocks, attachments), args.get("thread_ts")
        )
        result: JsonDict = {"channel": channel, "ts": msg["ts"], "message": copy.deepcopy(msg)}
        if warnings:
            result["warning"] = ",".join(warnings)
            result["response_metadata"] = {
                "warnings": warnings,
                "messages": [
                    "[WARN] Your message was truncated but still posted. "
                    "The `text` field accepts up to 40,000 characters."
                ],
            }
        return result

    def _chat_update(self, args: JsonDict) -> JsonDict:
        channel = self._channel(args)
        ts = args.get("ts")
        msg = self._by_ts.get((channel, ts)) if isinstance(ts, str) else None
        if msg is None:
            raise SlackApiFault("message_not_found")
        if msg.get("user") != self.bot_user_id:
            raise SlackApiFault("cant_update_message")
        text, blocks, _attachments, _warnings = self._content(args, limit_text=False)
        self._edit(channel, msg, text if "text" in args else None, blocks)
        return {
            "channel": channel,
            "ts": msg["ts"],
            "text": msg["text"],
            "message": copy.deepcopy(msg),
        }

    def _chat_post_ephemeral(self, args: JsonDict) -> JsonDict:
        channel = self._channel(args)
        user = args.get("user")
        if not isinstance(user, str) or not user:
            raise SlackApiFault("user_not_found")
        text, blocks, _attachments, warnings = self._content(args, limit_text=True)
        message_ts = self._next_ts()
        self._ephemerals.append(
            {
                "channel": channel,
                "user": user,
                "text": text,
                "blocks": blocks,
                "thread_ts": args.get("thread_ts"),
                "message_ts": message_ts,
                "via": "chat.postEphemeral",
                "warnings": warnings,
            }
        )
        return {"message_ts": message_ts}

    def _chat_get_permalink(self, args: JsonDict) -> JsonDict:
        channel = self._channel(args)
        ts = args.get("message_ts")
        msg = self._by_ts.get((channel, ts)) if isinstance(ts, str) else None
        if msg is None:
            raise SlackApiFault("message_not_found")
        link = (
            f"https://{self.team_domain}.slack.com/archives/{channel}/p{msg['ts'].replace('.', '')}"
        )
        thread_ts = msg.get("thread_ts")
        if thread_ts and thread_ts != msg["ts"]:
            link += f"?thread_ts={thread_ts}&cid={channel}"
        return {"channel": channel, "permalink": link}

    def _usergroups_users_list(self, args: JsonDict) -> JsonDict:
        group = args.get("usergroup")
        if not isinstance(group, str) or group not in self.usergroups:
            raise SlackApiFault("no_such_subteam")
        return {"users": list(self.usergroups[group])}

    def _users_info(self, args: JsonDict) -> JsonDict:
        user = args.get("user")
        if not isinstance(user, str) or not user:
            raise SlackApiFault("user_not_found")
        if self.users is not None and user not in self.users:
            raise SlackApiFault("user_not_found")
        name = self.users[user] if self.users is not None else user.lower()
        is_bot = user == self.bot_user_id
        return {
            "user": {
                "id": user,
                "team_id": self.team_id,
                "name": name,
                "real_name": name,
                "deleted": False,
                "is_bot": is_bot,
                "tz": "UTC",
                "profile": {"display_name": name, "real_name": name},
            }
        }

    def _files_get_upload_url_external(self, args: JsonDict) -> JsonDict:
        filename = args.get("filename")
        try:
            length = int(args.get("length", ""))
        except ValueError:
            raise SlackApiFault("invalid_arguments") from None
        if not isinstance(filename, str) or not filename or length < 0:
            raise SlackApiFault("invalid_arguments")
        file_id = self._next_id("F")
        self._files[file_id] = UploadedFile(id=file_id, filename=filename, length=length)
        return {"upload_url": f"{self.url}/upload/v1/{file_id}", "file_id": file_id}

    def _files_complete_upload_external(self, args: JsonDict) -> JsonDict:
        raw = args.get("files")
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raise SlackApiFault("invalid_arguments") from None
        if not isinstance(raw, list) or not raw:
            raise SlackApiFault("invalid_arguments")
        uploads: list[UploadedFile] = []
        for entry in raw:
            upload = self._files.get(entry.get("id", "")) if isinstance(entry, dict) else None
            if upload is None or upload.content is None:
                raise SlackApiFault("file_not_found")
            upload.title = entry.get("title") or upload.filename
            uploads.append(upload)
        targets: list[str] = []
        if args.get("channel_id"):
            targets.append(self._channel(args, "channel_id"))
        channels = args.get("channels")
        if isinstance(channels, str) and channels:
            targets.extend(self._channel({"channel": c}) for c in channels.split(","))
        thread_ts = args.get("thread_ts")
        comment = args.get("initial_comment")
        for channel in targets:
            msg = self._bot_message(comment if isinstance(comment, str) else "", None, None)
            msg["subtype"] = "file_share"
            msg["files"] = [{"id": u.id, "name": u.filename, "title": u.title} for u in uploads]
            stored = self._store_message(channel, msg, thread_ts)
            for u in uploads:
                u.shares.append((channel, thread_ts or None, stored["ts"]))
        return {
            "files": [
                {
                    "id": u.id,
                    "name": u.filename,
                    "title": u.title,
                    "size": len(u.content or b""),
                    "mimetype": "text/plain",
                    "permalink": f"https://{self.team_domain}.slack.com/files/{self.bot_user_id}/{u.id}/{u.filename}",
                }
                for u in uploads
            ]
        }

    def _apps_connections_open(self, _args: JsonDict) -> JsonDict:
        return {"url": self.socket_mode.issue_url(self.ws_base)}
