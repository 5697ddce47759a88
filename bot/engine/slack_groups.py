"""Who is in the user groups a policy names, read with ``usergroups.users.list`` for
``doctor`` (issue 22): the terminal has no Slack front end, but can ask the same Web API
when the bot's token is configured (``SLACK_BOT_TOKEN``, ``SLACK_API_URL``)."""

from __future__ import annotations

from collections.abc import Iterable

import aiohttp
from slack_sdk.errors import SlackApiError, SlackRequestError
from slack_sdk.web.async_client import AsyncWebClient

from bot.settings import Settings

DEFAULT_API_URL = "https://slack.com/api/"
_ERRORS = (SlackApiError, SlackRequestError, aiohttp.ClientError, OSError, TimeoutError)


async def read_groups(
    settings: Settings, groups: Iterable[str]
) -> tuple[dict[str, frozenset[str]], str]:
    """The members of each group Slack answered for, and why the others are missing
    ("" when none is): doctor names an unread group, it never guesses its size."""
    wanted = sorted(set(groups))
    if not wanted:
        return {}, ""
    if settings.slack_bot_token is None:
        return {}, "SLACK_BOT_TOKEN is not set"
    base_url = settings.slack_api_url or DEFAULT_API_URL
    # slack_sdk joins base_url and the method name with urljoin: it must end with '/'.
    client = AsyncWebClient(
        token=settings.slack_bot_token.get_secret_value(),
        base_url=base_url if base_url.endswith("/") else base_url + "/",
        timeout=10,
    )
    out: dict[str, frozenset[str]] = {}
    why = ""
    for group in wanted:
        try:
            resp = await client.usergroups_users_list(usergroup=group)
        except SlackApiError as exc:
            why = f"Slack answered {exc.response.get('error', 'an error')}"
            continue
        except _ERRORS as exc:
            why = f"Slack could not be reached: {exc}"
            continue
        out[group] = frozenset(str(u) for u in resp.get("users") or ())
    return out, why
