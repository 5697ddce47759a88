"""Who is in a Slack user group, for the approval policy: ``usergroups.users.list``,
cached for ``usergroup_cache_ttl_s`` for what only shows (a card's progress, who may
ask), and read fresh for what decides (an approve, deny or cancel click)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from slack_sdk.web.async_client import AsyncWebClient

from bot.slack.poster import SLACK_ERRORS

log = logging.getLogger(__name__)

Membership = dict[str, frozenset[str]]


class MembershipCache:
    """User-group members, fetched with ``usergroups.users.list`` and kept ``ttl_s``.

    A group whose lookup fails is left out of the answer (and not cached), so it
    grants nothing: the policy fails closed.
    """

    def __init__(
        self, client: AsyncWebClient, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.client = client
        self.ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def resolve(self, groups: Iterable[str]) -> Membership:
        out: Membership = {}
        for group in sorted(set(groups)):
            members = await self._members(group)
            if members is not None:
                out[group] = members
        return out

    async def fresh(self, groups: Iterable[str]) -> Membership | None:
        """Every group read from Slack now, bypassing the cache: what an approve, deny or
        cancel is judged by, so someone removed from a group loses the right at once, not
        up to ``ttl_s`` later. None when any group cannot be read: the caller refuses the
        click (fails closed) rather than judge it on part of the answer. A fresh answer
        also refreshes the cache."""
        out: Membership = {}
        for group in sorted(set(groups)):
            members = await self._fetch(group)
            if members is None:
                return None
            out[group] = members
        return out

    async def _members(self, group: str) -> frozenset[str] | None:
        # One lookup per group at a time: a burst of card renders shares the answer.
        async with self._locks.setdefault(group, asyncio.Lock()):
            hit = self._cache.get(group)
            if hit is not None and self._clock() < hit[0]:
                return hit[1]
            return await self._fetch(group)

    async def _fetch(self, group: str) -> frozenset[str] | None:
        try:
            resp = await self.client.usergroups_users_list(usergroup=group)
        except SLACK_ERRORS as exc:
            log.warning("cannot list members of user group %s (it grants nothing): %s", group, exc)
            return None
        members = frozenset(str(u) for u in resp.get("users") or ())
        self._cache[group] = (self._clock() + self.ttl_s, members)
        return members
