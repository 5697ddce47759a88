"""Boundary fakes for tests: Slack's Web API, response_urls and Socket Mode on 127.0.0.1."""

from .slack_api import ApiCall, FakeSlack, ResponseUrlPost, UploadedFile, validate_blocks
from .slack_requests import (
    PostResult,
    SignedRequest,
    SlackSigner,
    block_actions_payload,
    slash_command_payload,
)
from .socket_mode import ChangeSignal, FakeSocketMode, SocketConnection

__all__ = [
    "ApiCall",
    "ChangeSignal",
    "FakeSlack",
    "FakeSocketMode",
    "PostResult",
    "ResponseUrlPost",
    "SignedRequest",
    "SlackSigner",
    "SocketConnection",
    "UploadedFile",
    "block_actions_payload",
    "slash_command_payload",
    "validate_blocks",
]
