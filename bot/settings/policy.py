"""``[policy]`` and ``[services.NAME.policy]``: who may ask for a change, who approves
it and how many must, and when changes may start."""

from __future__ import annotations

from pydantic import Field, field_validator

from bot.settings.base import Section, slack_ids
from bot.settings.windows import WindowSettings


class PolicySettings(Section):
    requesters: list[str] = Field(default_factory=list)
    approvers: list[str] = Field(default_factory=list)
    min_approvals: int = Field(1, ge=1)
    allow_self_approval: bool = False
    approval_ttl_s: int = Field(900, gt=0)
    usergroup_cache_ttl_s: int = Field(300, ge=0)
    # Issue 22: when changes may start; None: at any time.
    windows: WindowSettings | None = None

    @property
    def timezone(self) -> str:
        """The zone this policy's times are read and shown in: its windows', else UTC."""
        return self.windows.timezone if self.windows is not None else "UTC"

    @field_validator("requesters", "approvers")
    @classmethod
    def slack_ids(cls, v: list[str]) -> list[str]:
        return slack_ids(v)


class ServicePolicySettings(Section):
    """``[services.NAME.policy]``: what a service overrides of ``[policy]`` (issue 22);
    a key left unset is the global one's (``Settings.policy_for``)."""

    requesters: list[str] | None = None
    approvers: list[str] | None = None
    min_approvals: int | None = Field(None, ge=1)
    # The service's own windows replace [policy.windows] whole (not merged: one place says
    # when this service may change).
    windows: WindowSettings | None = None

    @field_validator("requesters", "approvers")
    @classmethod
    def slack_ids(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else slack_ids(v)

    @field_validator("approvers")
    @classmethod
    def _someone(cls, v: list[str] | None) -> list[str] | None:
        # An empty list would mean anyone may approve stopping this service's GPUs.
        if v is not None and not v:
            raise ValueError("must name someone; leave it unset to use [policy].approvers")
        return v
