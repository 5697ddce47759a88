"""Secret masking: each pattern, no false positives on ordinary vLLM/uv output,
idempotence, and nested objects."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from bot.core.redact import Redactor, masked_json
from bot.settings import Settings

R = Redactor(["hunter2hunter2", "s3cr3t.value+x", "wxyz"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Literal values from the settings, wherever they appear; regex characters escaped.
        ("db pass is hunter2hunter2!", "db pass is ***!"),
        ("x=s3cr3t.value+x y", "x=*** y"),
        ("s3cr3tXvalue+x", "s3cr3tXvalue+x"),
        ("wxyzwxyz", "******"),
        # Slack tokens.
        ("SLACK xoxb-123456789012-1234567890123-AbCdEfGh", "SLACK xoxb-***"),
        ("xoxp-1234-5678-abcdef", "xoxp-***"),
        ("xoxa-2-abcdefgh xoxr-abcdefgh", "xoxa-*** xoxr-***"),
        ("refresh xoxe.xoxp-1-Mi0yLTE4", "refresh xoxe.xoxp-***"),
        ("xoxe-1-My0xLTEyMzQ", "xoxe-***"),
        ("app xapp-1-A0123456789-1234567890-abcdef", "app xapp-***"),
        # Credentials in URLs.
        ("https://user:tok3n@github.com/x.git", "https://user:***@github.com/x.git"),
        (
            "--index-url https://__token__:pypi-AgEIcHlwaS5vcmc@pypi.example/simple",
            "--index-url https://__token__:***@pypi.example/simple",
        ),
        ("postgres://app:p:w@db:5432/x", "postgres://app:***@db:5432/x"),
        ("https://ghtoken123@github.com/org/repo", "https://***@github.com/org/repo"),
        ("git+https://abc@host/x", "git+https://***@host/x"),
        ("HTTP://Token@Host/x", "HTTP://***@Host/x"),
        # Authorization headers.
        ("Authorization: Bearer eyJhbGciOi.e30.sig", "Authorization: Bearer ***"),
        ("authorization: basic dXNlcjpwYXNz", "authorization: basic ***"),
        ("Proxy-Authorization: Basic dXNlcjpwYXNz", "Proxy-Authorization: Basic ***"),
        ("Authorization: abcdef", "Authorization: ***"),
        ("Authorization: Bearer", "Authorization: ***"),
        ("{'Authorization': 'Bearer abc.def'}", "{'Authorization': 'Bearer ***'}"),
        ('-H "Authorization: token ghx123"', '-H "Authorization: token ***"'),
        ("401: Bearer abcdefgh12345678 rejected", "401: Bearer *** rejected"),
        # key=value, env assignments, query parameters, dict/JSON forms.
        ("HF_TOKEN=hf_xyz python -m vllm", "HF_TOKEN=*** python -m vllm"),
        ("export GITHUB_TOKEN='ghx y'", "export GITHUB_TOKEN='***'"),
        ("SLACK_SIGNING_SECRET=8f7e6d", "SLACK_SIGNING_SECRET=***"),
        ("DB_PASSWORD=pa55 next", "DB_PASSWORD=*** next"),
        ("OPENAI_API_KEY=sk-short", "OPENAI_API_KEY=***"),
        ("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "AWS_SECRET_ACCESS_KEY=***"),
        ("MY_SIGNING_KEY: abc", "MY_SIGNING_KEY: ***"),
        ("GET /x?token=abc123&page=2", "GET /x?token=***&page=2"),
        ("/y?api_key=k1;/z?apikey=k2,", "/y?api_key=***;/z?apikey=***,"),
        ("client_secret=cs passwd=pw pwd=/root", "client_secret=*** passwd=*** pwd=/root"),
        ("password = pw2", "password = ***"),
        ("x-api-key: abc", "x-api-key: ***"),
        ("{'api_key': 'k y', 'hf_token': None}", "{'api_key': '***', 'hf_token': None}"),
        ('{"password":"p w","user":"u"}', '{"password":"***","user":"u"}'),
        ("token='cut off", "token='*** off"),
        ("Token: abc", "Token: ***"),
        # Command-line flags.
        ("vllm serve m --api-key sk-local --port 8000", "vllm serve m --api-key *** --port 8000"),
        ("--hf-token hf_abc --x", "--hf-token *** --x"),
        ("--api-key=abc", "--api-key=***"),
        ("--hf-token --enforce-eager", "--hf-token --enforce-eager"),
        # Provider token shapes.
        ("hf_" + "a" * 34, "hf_***"),
        ("ghp_" + "A1" * 18, "ghp_***"),
        ("github_pat_" + "11AB_" * 10, "github_pat_***"),
        ("key sk-proj-abcdefghijklmnopqrstuvwx", "key sk-***"),
        ("AKIAIOSFODNN7EXAMPLE and ASIAIOSFODNN7EXAMPLE", "AKIA*** and ASIA***"),
    ],
)
def test_patterns(text: str, expected: str) -> None:
    assert R(text) == expected


def test_private_key_blocks() -> None:
    pem = (
        "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7\nabc+/=\n"
        "-----END RSA PRIVATE KEY-----\nmiddle\n"
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXkt\n-----END OPENSSH PRIVATE KEY-----\n"
        "after"
    )
    assert R(pem) == (
        "before\n-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----\nmiddle\n"
        "-----BEGIN OPENSSH PRIVATE KEY-----\n***\n-----END OPENSSH PRIVATE KEY-----\nafter"
    )
    # Output cut off mid-key (e.g. a tail of logs) masks to the end.
    assert R("x\n-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqh\nkiG9w0BAQEF") == (
        "x\n-----BEGIN PRIVATE KEY-----\n***"
    )
    # A public key is not a secret.
    pub = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOC\n-----END PUBLIC KEY-----"
    assert R(pub) == pub


def test_short_and_empty_literals_are_ignored() -> None:
    r = Redactor(["", "ab", "abc"])
    assert r("abc ab a") == "abc ab a"


def test_longest_literal_wins() -> None:
    r = Redactor(["pass", "password123"])
    assert r("x password123 y pass") == "x *** y ***"


def test_configured_secrets_are_masked() -> None:
    settings = Settings(
        security={"redact": ["corp-vault-pw"]},
        slack_bot_token="mytokenvalue",
        slack_signing_secret="signing-secret-1",
    )
    r = Redactor(settings.secret_values())
    out = r("a corp-vault-pw b mytokenvalue c signing-secret-1")
    assert out == "a *** b *** c ***"


ORDINARY = [
    "Downloading torch-2.9.1-cp312-cp312-manylinux_2_28_x86_64.whl (899.7MiB)",
    " Downloaded nvidia-cudnn-cu12",
    "Resolved 150 packages in 1.23s",
    "Installed 3 packages in 812ms",
    " + vllm==0.16.0rc2.dev313+g662205d34",
    " - vllm==0.15.1",
    "INFO 01-01 12:00:00 [api_server.py:1024] Starting vLLM API server on http://0.0.0.0:8000",
    "INFO 01-01 12:00:05 [gpu_worker.py:276] GPU KV cache size: 1,234,567 tokens",
    "Maximum concurrency for 8,192 tokens per request: 150.70x",
    "non-default args: {'model': '/models/kimi', 'tensor_parallel_size': 8, "
    "'max_num_batched_tokens': 8192, 'api_key': None, 'hf_token': None}",
    "max_num_batched_tokens=8192 tokenizer='/models/x' skip_tokenizer_init=False detokenize=True",
    "tokenizer_mode: auto, kv_cache_dtype: auto, enable_prefix_caching: True",
    "vllm serve /models/kimi --max-num-batched-tokens 8192 --tokenizer /models/kimi",
    "HF_HUB_ENABLE_HF_TRANSFER=1 CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM_USE_V1=1",
    "hf_hub_download_timeout_seconds_for_large_files=60",
    "git+https://github.com/vllm-project/vllm.git@v0.6.0",
    "ssh://root@gpu01:22 and root@gpu01",
    "https://wheels.vllm.ai/nightly/vllm-0.16.0rc2.dev313%2Bg662205d34-cp38-abi3-manylinux1_x86_64.whl",
    'INFO:     127.0.0.1:50000 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "commit 662205d34b1f0e8cbb4e5d1a2f3c4b5a6d7e8f90",
    "sha256:3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a",
    "Jan 01 12:00:00 gpu01 systemd[1]: Started vllm-kimi.service - vLLM kimi-k25.",
    "Authorization header missing; sending 401",
    "Bearer token required",
    "task-0123456789abcdefghijklmnopq",
    "|   0  NVIDIA H200   On  | 00000000:18:00.0 Off |   0 |  81559MiB / 143771MiB |",
]


@pytest.mark.parametrize("line", ORDINARY)
def test_no_false_positives(line: str) -> None:
    assert R(line) == line


def test_large_output_is_masked_line_for_line() -> None:
    lines = [ORDINARY[i % len(ORDINARY)] for i in range(100_000)]
    lines[54_321] = "HF_TOKEN=hf_" + "z" * 34
    out = R("\n".join(lines)).split("\n")
    assert len(out) == 100_000
    assert out[54_321] == "HF_TOKEN=***"
    assert out[:54_321] == lines[:54_321]
    assert out[54_322:] == lines[54_322:]


# --- properties ----------------------------------------------------------------

_FRAGMENTS = st.sampled_from(
    [
        "token",
        "TOKEN",
        "_key",
        "api_key",
        "password",
        "secret",
        "Authorization",
        "Bearer",
        "basic",
        "None",
        "null",
        "://",
        "https://",
        "ssh://",
        "@",
        ":",
        "=",
        "'",
        '"',
        " ",
        "\t",
        "\n",
        "&",
        ",",
        ";",
        "-",
        "--",
        "--api-key",
        "--hf-token",
        "xoxb-",
        "xoxe.",
        "xapp-",
        "hf_",
        "ghp_",
        "sk-",
        "AKIA",
        "ASIA",
        "*",
        "***",
        "abcd",
        "hunter2hunter2",
        "s3cr3t",
        "-----BEGIN RSA PRIVATE KEY-----",
        "-----END RSA PRIVATE KEY-----",
        "PRIVATE KEY-----",
        "0123456789abcdefghij",
        "ABCDEFGHIJKLMNOP",
    ]
)
# Secret-shaped snippets: a key word, a separator and a value, in every mix.
_ASSIGNMENTS = st.tuples(
    st.sampled_from(
        [
            "token",
            "HF_TOKEN",
            "api-key",
            "x_key",
            "Authorization",
            "--hf-token",
            "https://u",
            "https://",
            "Bearer",
            "xoxb",
            "hf",
            "password",
        ]
    ),
    st.sampled_from(["=", ": ", ":", " ", "='", '": "', "-", "_", "@", "://", "= "]),
    st.one_of(_FRAGMENTS, st.text(alphabet="aZ09_-=:'\" /@*.", max_size=24)),
).map("".join)
_TEXT = st.lists(
    st.one_of(
        _FRAGMENTS,
        _ASSIGNMENTS,
        st.text(alphabet="aZ09_-=:'\" \t\n/@*.&,;+", max_size=6),
        st.text(max_size=3),
    ),
    max_size=30,
).map("".join)
_LITERALS = st.lists(
    st.text(alphabet="abcdefghijkXYZ0123456789._-+/@:=", min_size=4, max_size=12), max_size=4
)


@hyp_settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEXT, _LITERALS)
def test_idempotent(text: str, literals: list[str]) -> None:
    r = Redactor(literals)
    once = r(text)
    assert r(once) == once


@hyp_settings(max_examples=300, deadline=None)
@given(st.lists(_TEXT, min_size=1, max_size=8), _LITERALS)
def test_remembered_answers_are_the_computed_ones(texts: list[str], literals: list[str]) -> None:
    # Short texts are answered from a cache the second time: it must never answer for
    # another text or another redactor's secrets.
    r, other = Redactor(literals), Redactor([])
    for text in texts * 2:
        assert r(text) == r.uncached(text)
        assert other(text) == other.uncached(text)


def test_the_cache_is_bounded_and_skips_long_texts() -> None:
    r = Redactor(["s3cr3t-value"])
    for i in range(20_000):
        r(f"pkg{i}==1.0 s3cr3t-value")
    info = r._short.cache_info()
    assert info.currsize <= 8192 and info.maxsize == 8192
    long = "token s3cr3t-value " + "x" * 300
    before = r._short.cache_info().misses
    assert "s3cr3t-value" not in r(long)
    assert r._short.cache_info().misses == before  # computed, not cached


@hyp_settings(max_examples=300, deadline=None)
@given(_TEXT, _LITERALS)
def test_literals_never_survive(text: str, literals: list[str]) -> None:
    out = Redactor(literals)(text)
    for secret in literals:
        assert secret not in out


# --- private keys whose BEGIN line is cut off ------------------------------------
# Real keys, generated per test run: by OpenSSH's ssh-keygen (the tool the issue
# names) where it is installed, and always by asyncssh, which writes the same formats.
# OpenSSH's format has 70-character lines, PEM's 64; the last line is shorter.


def _ssh_keygen(tmp: Path, kind: str, *extra: str) -> str:
    path = tmp / kind
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "issue9", "-f", str(path), *extra],
        check=True,
        capture_output=True,
    )
    return path.read_text()


@pytest.fixture(scope="module")
def private_keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    import asyncssh

    keys = {
        "asyncssh ed25519 openssh": asyncssh.generate_private_key("ssh-ed25519")
        .export_private_key()
        .decode(),
        "asyncssh rsa pkcs1-pem": asyncssh.generate_private_key("ssh-rsa", key_size=2048)
        .export_private_key("pkcs1-pem")
        .decode(),
        "asyncssh rsa pkcs8-pem": asyncssh.generate_private_key("ssh-rsa", key_size=2048)
        .export_private_key("pkcs8-pem")
        .decode(),
    }
    if shutil.which("ssh-keygen"):
        tmp = tmp_path_factory.mktemp("keys")
        keys["ssh-keygen -t ed25519"] = _ssh_keygen(tmp, "ed25519")
        keys["ssh-keygen -t rsa"] = _ssh_keygen(tmp, "rsa", "-b", "2048")
        (tmp / "rsa").unlink()
        keys["ssh-keygen -t rsa -m PEM"] = _ssh_keygen(tmp, "rsa", "-b", "2048", "-m", "PEM")
    return keys


def _body(key: str) -> list[str]:
    lines = key.strip().splitlines()
    assert "PRIVATE KEY-----" in lines[0] and "PRIVATE KEY-----" in lines[-1]
    return lines[1:-1]


def _leaks(out: str, key: str) -> list[str]:
    """Runs of 8+ base64 characters in ``out`` that are part of the key's body."""
    body = _body(key)
    return [
        run for run in re.findall(r"[A-Za-z0-9+/=]{8,}", out) if any(run in line for line in body)
    ]


JOURNAL = "Nov 30 13:12:{:02d} gpu-node-01 python3[4242]: "


def _cuts(key: str) -> list[tuple[str, str]]:
    """The key's text cut at every line and in the middle of each line, raw and as
    journald prints it, always ending with the END line."""
    lines = key.strip().splitlines()
    out: list[tuple[str, str]] = []
    for start in range(1, len(lines) - 1):
        tail = lines[start:]
        out.append((f"from line {start}", "\n".join(tail)))
        out.append((f"mid line {start}", "\n".join([tail[0][len(tail[0]) // 2 :], *tail[1:]])))
        logged = [JOURNAL.format(i) + line for i, line in enumerate(tail)]
        out.append((f"journal from line {start}", "\n".join(logged)))
        out.append(
            (f"journal cut inside the prefix at {start}", "\n".join([logged[0][7:], *logged[1:]]))
        )
    return out


def test_a_key_without_its_begin_line_is_masked_at_every_cut(private_keys: dict[str, str]) -> None:
    for name, key in private_keys.items():
        end = key.strip().splitlines()[-1]
        for cut, text in _cuts(key):
            out = R(f"$ journalctl -u vllm -n 5\n{text}\nafter")
            assert not _leaks(out, key), (name, cut, out)
            assert end in out and out.endswith("\nafter"), (name, cut, out)
            assert out.startswith("$ journalctl -u vllm -n 5\n"), (name, cut, out)
            assert R(out) == out  # idempotent


def test_vllm_logs_tail_ending_in_a_key(private_keys: dict[str, str]) -> None:
    # The case: `/vllm logs -n 5` on a journal whose last lines end a key.
    key = private_keys["asyncssh ed25519 openssh"]
    journal = [JOURNAL.format(i) + line for i, line in enumerate(key.strip().splitlines())]
    out = R("\n".join(journal[-5:]))
    assert not _leaks(out, key)
    assert out == (JOURNAL.format(len(journal) - 5) + "***\n" + journal[-1])


def test_a_key_cut_at_both_ends_is_masked(private_keys: dict[str, str]) -> None:
    for name, key in private_keys.items():
        body = _body(key)
        full = [i for i, line in enumerate(body) if len(line) in (64, 70)]
        for start in full:
            for stop in range(start + 1, len(body) + 1):
                text = "\n".join(body[start:stop])
                out = R(f"before\n{text}\nafter")
                assert not _leaks(out, key), (name, start, stop, out)
                assert out == "before\n***\nafter", (name, start, stop, out)
                # One line at a time, as the terminal prints streamed output.
                for line in body[start:stop]:
                    if len(line) in (64, 70):
                        assert R(line) == "***"


def test_a_dry_run_refusal_ending_in_a_key_is_masked_in_the_summary(
    private_keys: dict[str, str],
) -> None:
    # The refusal quotes the last 4 lines of the dry run's output; it becomes the card's
    # text and runs.summary, both of which pass through the Redactor.
    key = private_keys["asyncssh rsa pkcs1-pem"]
    tail = "\n".join(key.strip().splitlines()[-4:])
    summary = f"preflight refused; service untouched: install dry run failed (exit 2): {tail}"
    out = R(summary)
    assert not _leaks(out, key)
    assert out == (
        "preflight refused; service untouched: install dry run failed (exit 2): "
        "***\n-----END RSA PRIVATE KEY-----"
    )


def test_certificates_and_hex_digests_are_not_keys() -> None:
    # The body of a public PEM block keeps its lines; so do 64-digit hex digests.
    cert_line = "MIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ"
    cert = f"-----BEGIN CERTIFICATE-----\n{cert_line}\n{cert_line}\n-----END CERTIFICATE-----"
    assert R(cert) == cert
    digests = "\n".join(["3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a"] * 3)
    assert R(digests) == digests


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Issue 9: masked only up to the ";".
        ("DB_PASSWORD=hunter2;rest", "DB_PASSWORD=***"),
        ("export DB_PASSWORD=a&b,c;d next", "export DB_PASSWORD=*** next"),
        # In a URL query or a connection string, ";" and "&" start the next parameter.
        ("GET /x?token=abc;page=2", "GET /x?token=***;page=2"),
        ("Server=db;Password=p;Database=app", "Server=db;Password=***;Database=app"),
        ("/y?api_key=k1&password=p2&x=1", "/y?api_key=***&password=***&x=1"),
    ],
)
def test_a_secret_value_is_masked_whole(text: str, expected: str) -> None:
    assert R(text) == expected
    assert R(expected) == expected


@pytest.mark.parametrize(
    "sample", ["uv_pip_install_vllm_fresh.txt", "uv_pip_freeze_vllm_0.33.0.txt"]
)
def test_real_uv_output_passes_unchanged(sample: str) -> None:
    # Captured from the real uv installing vllm (tests/samples/SOURCES.md). It lists
    # tiktoken==0.14.0, whose name ends in "token": a pin ("==") is no assignment.
    text = (Path(__file__).parent / "samples" / sample).read_text()
    assert "tiktoken==" in text
    assert Redactor()(text) == text


def test_masked_json_masks_each_string_and_keeps_the_structure() -> None:
    # What `doctor --json` and `audit --format jsonl` serialize: a value ending in a
    # secret's key stays one string (masking the dumped text took the `","` after it).
    r = Redactor(["Zq8vLm2XpR4tKw9N"])
    check = {
        "detail": "uv: error: HF_TOKEN=",
        "fix": 'set "api_key": "Zq8vLm2XpR4tKw9N"',
        "token=": ["password=hunter2", 3, None, True],
    }
    masked = masked_json(check, r)
    assert masked == {
        "detail": "uv: error: HF_TOKEN=",
        "fix": 'set "api_key": "***"',
        "token=": ["password=***", 3, None, True],
    }
    assert json.loads(json.dumps(masked)) == masked
    # the old way: the dump masked, its structure eaten
    with pytest.raises(json.JSONDecodeError):
        json.loads(r(json.dumps(check)))
