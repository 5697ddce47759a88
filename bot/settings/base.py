"""What every settings section shares: the name and URL rules, the strict base model, and
the checks of Slack IDs (``bot.settings`` builds the sections on them)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from bot.errors import ConfigError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
UNIT_RE = re.compile(r"[A-Za-z0-9:_.@-]{1,200}")
PACKAGE_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9_,.-]+\])?")
SLACK_ID_RE = re.compile(r"[UWS][A-Z0-9]{2,}")
GPU_UUID_RE = re.compile(r"(GPU|MIG)-[0-9A-Fa-f][0-9A-Fa-f-]{7,}")
# A POSIX account name (useradd's default rule).
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# What a sudoers rule can name exactly: an absolute path with nothing sudoers or its
# wildcards would read as syntax.
SUDO_PATH_RE = re.compile(r"/[A-Za-z0-9._+/@-]+")
LOCAL = "local"


def _name(value: str) -> str:
    # fullmatch: `$` would let one trailing newline through ("kimi\n").
    if not NAME_RE.fullmatch(value):
        raise ValueError(f"{value!r} is not a valid name (letters, digits, '.', '_', '-')")
    return value


def http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL")
    if any(c.isspace() for c in value):
        raise ValueError(f"{value!r} contains whitespace")
    return value


def _plain_http(value: str) -> str:
    if urlsplit(value).scheme != "http":
        raise ValueError(
            "must be http://: it is fetched from the host itself through the SSH connection"
        )
    return value


Name = Annotated[str, AfterValidator(_name)]
HttpUrlStr = Annotated[str, AfterValidator(http_url)]
HealthUrl = Annotated[str, AfterValidator(http_url), AfterValidator(_plain_http)]


def expand(p: Path) -> Path:
    return Path(os.path.expanduser(str(p)))


class Section(BaseModel):
    # A typo in a key must be an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


def slack_ids(v: list[str]) -> list[str]:
    for item in v:
        if not SLACK_ID_RE.fullmatch(item):
            raise ValueError(f"{item!r} is not a Slack user (U…/W…) or user-group (S…) ID")
    return v


def environment_only(data: Mapping[str, Any], path: Path, fields: Mapping[str, FieldInfo]) -> None:
    """The values that may hold a secret (the database's URL, Slack's tokens) and where a
    deployment runs come from the environment only (the fields with an environment
    alias), never from the config file: refuse the file naming the key."""
    for name, field in fields.items():
        alias = field.validation_alias
        if isinstance(alias, str) and (name in data or alias in data):
            raise ConfigError(
                f"{path}: {name if name in data else alias} is read from the environment "
                f"only ({alias}), never from the config file"
            )
