"""The load of a vLLM server, from its Prometheus ``/metrics`` text: pure.

vLLM publishes its metrics with ``prometheus_client``; they are read here with the
same library's text parser rather than by hand. A server with several engines (data
parallel) labels each engine's gauge with ``engine="N"``: the counts are summed, the
KV-cache usage is the highest engine's. Names are matched exactly: current vLLM also
publishes ``vllm:num_requests_waiting_by_reason`` (the same waiting requests by reason).

vLLM renames a metric by deprecating it: a metric deprecated in release X.Y is hidden in
X.Y+1 unless the server runs with ``--show-hidden-metrics-for-version=X.Y``, and removed
in X.Y+2 (vLLM's metrics docs; PR #15458, PR #29330). So a server exports the new name,
or the old one (a release before the rename), or both (the releases between, or the
escape hatch). Each quantity is read under the first of its names the server exports,
current name first: ``vllm:gpu_cache_usage_perc`` (deprecated in 0.9, hidden from 0.10,
removed by PR #29330 in November 2025) is read only from a server without
``vllm:kv_cache_usage_perc``. The request gauges ``vllm:num_requests_running`` and
``vllm:num_requests_waiting`` have kept their names from V0 to the V1 engine of 0.3x.
A metric that is absent stays unknown (None), never 0: a server started with
``--disable-log-stats`` registers no ``vllm:`` metric at all and its ``/metrics`` holds
only prometheus_client's ``python_*`` and ``process_*`` families, and vllm-project/vllm
issue #8612 shows one answering 200 with an empty body. Such a load is unknown, never
idle.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# Current name first, then the older ones (hidden, then removed, after a rename).
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class Load:
    running: int | None
    waiting: int | None
    kv_cache_usage: float | None = None  # 0..1

    @property
    def known(self) -> bool:
        """Both request counts were read: only then can the server be called idle."""
        return self.running is not None and self.waiting is not None

    @property
    def idle(self) -> bool:
        """No request runs or waits; an unknown count is never taken for 0."""
        return self.running == 0 and self.waiting == 0

    def missing(self) -> str:
        """The request gauges the text lacks, as the refusal names them."""
        names = [n for n, v in ((RUNNING, self.running), (WAITING, self.waiting)) if v is None]
        return " or ".join(names)

    def describe(self) -> str:
        """ "3 running, 1 waiting requests, KV cache 42 % used"."""

        def n(v: int | None) -> str:
            return "?" if v is None else str(v)

        text = f"{n(self.running)} running, {n(self.waiting)} waiting requests"
        if self.kv_cache_usage is not None:
            text += f", KV cache {self.kv_cache_usage * 100:.0f} % used"
        return text


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


def parse_load(text: str, *, truncated: bool = False) -> Load:
    """The load in ``text`` (``GET /metrics``'s body). A body cut at the transport's
    bound is parsed up to its last whole line. Raises MetricsError for text that is not
    Prometheus format."""
    if truncated:
        text = text[: text.rfind("\n") + 1]
    sums: dict[str, float] = {}
    fullest: dict[str, float] = {}  # per KV name: the highest engine's
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (RUNNING, WAITING):
                    sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
                elif sample.name in KV_USAGE:
                    fullest[sample.name] = max(fullest.get(sample.name, 0.0), sample.value)
    except ValueError as e:
        raise MetricsError(f"not Prometheus text: {str(e)[:120]}") from None

    def count(name: str) -> int | None:
        return round(sums[name]) if name in sums else None

    kv = next((fullest[n] for n in KV_USAGE if n in fullest), None)
    return Load(count(RUNNING), count(WAITING), kv)
