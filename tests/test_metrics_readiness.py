"""vLLM's /metrics load and its readiness answers (bot.core.metrics, bot.core.readiness).

vLLM publishes /metrics with ``prometheus_client`` (vllm/v1/metrics/loggers.py,
``PrometheusStatLogger``: gauges ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` "Number of requests in model execution batches." / "...
waiting to be processed.", labelled ``model_name`` and ``engine``, and
``vllm:kv_cache_usage_perc``, which older versions called ``vllm:gpu_cache_usage_perc``).
So the exposition text below is real output of that library, made with vLLM's metric
names, documentation and labels; no live vLLM could be captured on a machine without a
GPU (tests/samples/SOURCES.md)."""

from __future__ import annotations

import pytest
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from bot.core.metrics import Load, MetricsError, parse_load
from bot.core.readiness import (
    api_base,
    completion_body,
    completion_text,
    error_message,
    metrics_url,
    model_ids,
    reported_version,
)
from bot.settings import ServiceSettings

MODEL = "kimi-k2.5"


def vllm_metrics(
    running: dict[str, float],
    waiting: dict[str, float],
    kv: dict[str, float] | None = None,
    *,
    kv_name: str = "vllm:kv_cache_usage_perc",
) -> str:
    """What a vLLM API server's /metrics returns, one labelled gauge per engine."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    g_run = Gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        labels,
        registry=reg,
    )
    g_wait = Gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        labels,
        registry=reg,
    )
    g_kv = Gauge(kv_name, "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg)
    Counter(
        "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
    ).labels(MODEL, "0").inc(123456)
    for engine, v in running.items():
        g_run.labels(MODEL, engine).set(v)
    for engine, v in waiting.items():
        g_wait.labels(MODEL, engine).set(v)
    for engine, v in (kv or {}).items():
        g_kv.labels(MODEL, engine).set(v)
    return generate_latest(reg).decode()


def test_counts_are_summed_over_engines_and_kv_is_the_fullest() -> None:
    text = vllm_metrics({"0": 3, "1": 2}, {"0": 0, "1": 1}, {"0": 0.25, "1": 0.5})
    assert 'vllm:num_requests_running{engine="1",model_name="kimi-k2.5"} 2.0' in text
    load = parse_load(text)
    assert load == Load(5, 1, 0.5)
    assert not load.idle
    assert load.describe() == "5 running, 1 waiting requests, KV cache 50 % used"


def test_an_idle_server_and_the_old_kv_name() -> None:
    load = parse_load(
        vllm_metrics({"0": 0}, {"0": 0}, {"0": 0.0}, kv_name="vllm:gpu_cache_usage_perc")
    )
    assert load == Load(0, 0, 0.0) and load.idle and load.known


def test_absent_metrics_stay_unknown_not_zero() -> None:
    load = parse_load(
        "# HELP python_info x\n# TYPE python_info gauge\n"
        'python_info{implementation="CPython"} 1.0\n'
    )
    assert load == Load(None, None, None)
    assert not load.known and load.describe() == "? running, ? waiting requests"
    assert not load.idle  # issue 17, D5: unknown is never idle


def default_collectors_only() -> str:
    """What /metrics of a vLLM started with --disable-log-stats answers: vLLM registers no
    stat logger then (vllm/v1/engine/async_llm.py: ``if self.log_stats:``), so the text is
    prometheus_client's default collectors alone, here that library's real output."""
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    return generate_latest(reg).decode()


def test_a_server_without_vllm_gauges_or_with_an_empty_body_is_unknown_not_idle() -> None:
    text = default_collectors_only()
    assert "python_gc_objects_collected_total" in text and "python_info" in text
    for body in (text, ""):  # "" : vllm-project/vllm issue #8612, 200 with an empty body
        load = parse_load(body)
        assert load == Load(None, None, None)
        assert not load.known and not load.idle
        assert load.missing() == "vllm:num_requests_running or vllm:num_requests_waiting"


def test_one_gauge_of_the_two_is_not_enough_to_call_the_server_idle() -> None:
    text = vllm_metrics({"0": 0}, {})  # running 0, waiting absent (no sample)
    load = parse_load(text)
    assert load.running == 0 and load.waiting is None
    assert not load.known and not load.idle
    assert load.missing() == "vllm:num_requests_waiting"
    # The good case: both 0 is idle.
    assert parse_load(vllm_metrics({"0": 0}, {"0": 0})).idle


def test_a_body_cut_at_the_bound_is_read_to_its_last_whole_line() -> None:
    text = vllm_metrics({"0": 4}, {"0": 2})
    cut = text[: text.index("vllm:num_requests_waiting{") + 20]
    with pytest.raises(MetricsError):
        parse_load(cut + "\n")
    assert parse_load(cut, truncated=True).running == 4


def test_text_that_is_not_prometheus_is_an_error() -> None:
    with pytest.raises(MetricsError):
        parse_load('{"detail":"Not Found"} 12 {{\n')


def service(**kw: object) -> ServiceSettings:
    return ServiceSettings(hosts=["h1"], unit="vllm", python="/opt/v/bin/python", **kw)


def test_the_api_base_is_health_urls_origin_unless_api_url_is_set() -> None:
    assert api_base(service(health_url="http://127.0.0.1:8000/health")) == "http://127.0.0.1:8000"
    assert metrics_url(service(api_url="http://10.0.0.5:9000/")) == "http://10.0.0.5:9000/metrics"


def test_a_smoke_expectation_must_be_a_regular_expression() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        service(smoke_expect="Paris(")


# vllm/entrypoints/openai/protocol.py: ModelList / ModelCard (object "model", owned_by
# "vllm", root, parent, max_model_len, permission), CompletionResponse, ErrorResponse.
MODELS = (
    '{"object":"list","data":[{"id":"kimi-k2.5","object":"model","created":1764500000,'
    '"owned_by":"vllm","root":"/models/Kimi-K2.5","parent":null,"max_model_len":262144,'
    '"permission":[]}]}'
)
COMPLETION = (
    '{"id":"cmpl-5c1e","object":"text_completion","created":1764500001,'
    '"model":"kimi-k2.5","choices":[{"index":0,"text":" Paris.","logprobs":null,'
    '"finish_reason":"stop","stop_reason":null,"prompt_logprobs":null}],'
    '"usage":{"prompt_tokens":6,"total_tokens":9,"completion_tokens":3}}'
)
ERROR = (
    '{"object":"error","message":"The model `kimi` does not exist.",'
    '"type":"NotFoundError","param":null,"code":404}'
)


def test_readiness_answers_in_vllms_formats() -> None:
    assert model_ids(MODELS) == ["kimi-k2.5"]
    assert model_ids('{"detail":"Not Found"}') is None and model_ids("<html>") is None
    assert completion_text(COMPLETION) == " Paris."
    assert completion_text(ERROR) is None and completion_text("") is None
    assert error_message(ERROR) == "The model `kimi` does not exist."
    assert error_message('{"error":{"message":"boom","code":500}}') == "boom"
    assert error_message("Internal Server Error") == "Internal Server Error"
    assert reported_version('{"version":"0.16.0"}') == "0.16.0"
    assert reported_version('{"detail":"Not Found"}') is None


def test_the_smoke_request_is_deterministic() -> None:
    assert completion_body(MODEL, "The capital of France is", 16) == (
        b'{"model": "kimi-k2.5", "prompt": "The capital of France is", "max_tokens": 16, '
        b'"temperature": 0, "stream": false}'
    )
