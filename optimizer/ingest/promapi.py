"""A client of the Prometheus HTTP API (``/api/v1/query_range``, ``/api/v1/label/…/values``), as Prometheus and
its compatibles (VictoriaMetrics, Thanos, Mimir, Cortex) serve it.

What a real server needs and does, written beside the code that meets it:

* Authentication: a bearer token (read from a file, as Prometheus' own ``authorization.credentials_file`` and a
  Kubernetes service account do, so it never sits on a command line), or basic auth; TLS with a private CA.
* Every answer is ``{"status": "success"|"error", "data": …, "errorType": …, "error": …}``, with HTTP 400 for a bad
  query, 422 for one the engine cannot run (too many samples, a timeout), 503 while the server is overloaded or
  starting. A query too large for the server is refused, never truncated: Prometheus by its resolution limit
  (11,000 points a series) and ``--query.max-samples`` (50 million); VictoriaMetrics by
  ``-search.maxPointsPerTimeseries`` (30,000), ``-search.maxSamplesPerQuery`` and ``-search.maxUniqueTimeseries``;
  Thanos and Mimir by their own limits with similar words. Those are told apart (``TooLarge``) so that the reader
  splits the query and asks again.
* Values are strings (``"12.5"``, ``"NaN"``, ``"+Inf"``), timestamps seconds as floats.

An answer is read with a bounded size (``max_response_bytes``): a server, or something in its place, that sends
without end costs a clear error, not the optimizer's memory.
"""

from __future__ import annotations

import base64
import math
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import msgspec

# Words with which Prometheus, VictoriaMetrics, Thanos and Mimir refuse a query for its size (lowered).
_TOO_LARGE = (
    "exceeded maximum resolution",  # Prometheus: more than 11,000 points a series
    "too many samples",  # Prometheus: query processing would load too many samples into memory
    "maxpointspertimeseries",  # VictoriaMetrics
    "maxsamplesperquery",
    "maxuniquetimeseries",
    "maxseriesperquery",
    "cannot select more than",
    "too many points",
    "the query hit the max number of chunks",  # Mimir, Cortex
    "exceeded the limit",
    "would fetch too many",
    "response is too large",  # this client's own bound
)


class PrometheusError(Exception):
    """A Prometheus API call that failed, in one line for a person."""


class TooLarge(PrometheusError):
    """The server refused a query for its size: a smaller one may pass."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to reach a Prometheus-compatible server."""

    url: str
    bearer_token_file: Path | None = None
    basic_user: str | None = None
    basic_password_file: Path | None = None
    ca_file: Path | None = None
    timeout: float = 60.0
    max_response_bytes: int = 256 * 1024 * 1024
    headers: Mapping[str, str] = field(default_factory=dict)  # e.g. X-Scope-OrgID for Mimir and Cortex tenants

    def auth_headers(self) -> dict[str, str]:
        """The Authorization header, read from its file at each call (a rotated token is picked up)."""
        out = dict(self.headers)
        if self.bearer_token_file is not None:
            token = _read_secret(self.bearer_token_file, "bearer token")
            out["Authorization"] = f"Bearer {token}"
        elif self.basic_user is not None:
            password = "" if self.basic_password_file is None else _read_secret(self.basic_password_file, "password")
            pair = base64.b64encode(f"{self.basic_user}:{password}".encode()).decode("ascii")
            out["Authorization"] = f"Basic {pair}"
        return out


def _read_secret(path: Path, what: str) -> str:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise PrometheusError(f"cannot read the {what} file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise PrometheusError(f"the {what} file {path} is not text") from None
    if not text or any(c in text for c in "\r\n"):
        raise PrometheusError(f"the {what} file {path} must hold one line")
    return text


class _Series(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, str]] = []


class _Matrix(msgspec.Struct):
    resultType: str
    result: list[_Series]


class _FloatSeries(msgspec.Struct):
    metric: dict[str, str]
    values: list[tuple[float, float]] = []


class _FloatMatrix(msgspec.Struct):
    resultType: str
    result: list[_FloatSeries]


class _FloatAnswer(msgspec.Struct):
    """An answer whose values msgspec reads as numbers itself (``strict=False``): ten times faster than a float()
    a point, for answers without "+Inf" or "-Inf", which it does not read."""

    status: str
    data: _FloatMatrix | None = None


class _RangeAnswer(msgspec.Struct):
    status: str
    data: _Matrix | None = None
    error: str | None = None
    errorType: str | None = None
    warnings: list[str] = []


class _ListAnswer(msgspec.Struct):
    status: str
    data: list[str] | None = None
    error: str | None = None
    errorType: str | None = None


class _ErrorAnswer(msgspec.Struct):
    status: str = "error"
    error: str | None = None
    errorType: str | None = None


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a range query: its labels (``__name__`` among them) and its finite points, in time order."""

    labels: dict[str, str]
    times: list[float]
    values: list[float]


def _finite(values: Sequence[tuple[float, str]]) -> tuple[list[float], list[float]]:
    times: list[float] = []
    out: list[float] = []
    for t, v in values:
        try:
            x = float(v)
        except ValueError:
            continue
        if math.isfinite(x) and math.isfinite(t):
            times.append(t)
            out.append(x)
    return times, out


def _finite_floats(labels: dict[str, str], values: list[tuple[float, float]]) -> Series | None:
    times = [t for t, _ in values]
    out = [v for _, v in values]
    # a sum is finite only when every term is (a NaN or an infinity carries through), or overflows: then look closer
    if not (math.isfinite(sum(out)) and math.isfinite(sum(times))):
        kept = [(t, v) for t, v in values if math.isfinite(t) and math.isfinite(v)]
        times, out = [t for t, _ in kept], [v for _, v in kept]
    return Series(labels, times, out) if times else None


class PromClient:
    """Calls to one server over one connection pool; ``async with PromClient(endpoint) as client``."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.base = endpoint.url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0
        self.bytes_read = 0

    async def __aenter__(self) -> PromClient:
        context: ssl.SSLContext | bool = True
        if self.endpoint.ca_file is not None:
            try:
                context = ssl.create_default_context(cafile=str(self.endpoint.ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise PrometheusError(f"cannot read the CA file {self.endpoint.ca_file}: {exc}") from None
        timeout = aiohttp.ClientTimeout(total=self.endpoint.timeout)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=context, limit=8))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(self, path: str, params: list[tuple[str, str]], post: bool = True) -> bytes:
        if self._session is None:
            raise RuntimeError("PromClient used outside `async with`")
        url = f"{self.base}{path}"
        self.requests += 1
        try:
            # Queries go as a POST form: long selectors (a chunk's node names) never meet a URL length limit.
            # Prometheus serves label values on GET only.
            headers = self.endpoint.auth_headers()
            request = (
                self._session.post(url, data=params, headers=headers)
                if post
                else self._session.get(url, params=params, headers=headers)
            )
            async with request as resp:
                body = await self._read(resp)
                if resp.status >= 400:
                    raise self._refused(resp.status, body)
                return body
        except TimeoutError:
            raise PrometheusError(
                f"{self.base} did not answer within {self.endpoint.timeout:g} s (raise --timeout, or import less at "
                "once with a shorter --since)"
            ) from None
        except aiohttp.ClientConnectorCertificateError as exc:
            raise PrometheusError(
                f"{self.base}: TLS certificate not trusted ({exc.certificate_error}); give --ca-file"
            ) from None
        except aiohttp.ClientConnectorError as exc:
            raise PrometheusError(f"cannot reach {self.base}: {exc.os_error.strerror or exc.os_error}") from None
        except aiohttp.ClientError as exc:
            raise PrometheusError(f"{self.base}: {exc.__class__.__name__}: {exc}") from None

    async def _read(self, resp: aiohttp.ClientResponse) -> bytes:
        limit = self.endpoint.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in resp.content.iter_chunked(1 << 20):
            size += len(chunk)
            if size > limit:
                raise TooLarge(f"{self.base}: response is too large (over {limit >> 20} MiB); asked for less")
            chunks.append(chunk)
        self.bytes_read += size
        return b"".join(chunks)

    def _refused(self, status: int, body: bytes) -> PrometheusError:
        try:
            answer = msgspec.json.decode(body, type=_ErrorAnswer)
            detail = (answer.error or "").strip()
        except msgspec.DecodeError:
            detail = body[:200].decode("utf-8", "replace").strip()
        detail = " ".join(detail.split())[:300]
        if status in (401, 403):
            return PrometheusError(f"{self.base} refused the credentials (HTTP {status}): {detail or 'no detail'}")
        if status == 404:
            return PrometheusError(f"{self.base}: no Prometheus API there (HTTP 404); give the server's base URL")
        kind = TooLarge if _too_large(detail) else PrometheusError
        return kind(f"{self.base} answered HTTP {status}: {detail or 'no detail'}")

    async def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        """``query`` evaluated every ``step`` seconds from ``start`` to ``end``: every series with its finite points."""
        params = [("query", query), ("start", _ts(start)), ("end", _ts(end)), ("step", f"{step:g}")]
        body = await self._call("/api/v1/query_range", params)
        try:
            quick = msgspec.json.decode(body, type=_FloatAnswer, strict=False)
        except (msgspec.ValidationError, msgspec.DecodeError):
            pass
        else:
            if quick.status == "success" and quick.data is not None and quick.data.resultType == "matrix":
                found = (_finite_floats(x.metric, x.values) for x in quick.data.result)
                return [x for x in found if x is not None]
        try:
            answer = msgspec.json.decode(body, type=_RangeAnswer)
        except msgspec.DecodeError as exc:
            raise PrometheusError(f"{self.base}: not a Prometheus answer ({exc})") from None
        if answer.status != "success" or answer.data is None:
            detail = answer.error or "no data"
            kind = TooLarge if _too_large(detail) else PrometheusError
            raise kind(f"{self.base}: query refused: {detail}")
        if answer.data.resultType != "matrix":
            raise PrometheusError(f"{self.base}: a range query answered {answer.data.resultType!r}, not a matrix")
        out = []
        for one in answer.data.result:
            times, values = _finite(one.values)
            if times:
                out.append(Series(one.metric, times, values))
        return out

    async def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """The values ``label`` takes on the series ``match`` selects between ``start`` and ``end``."""
        params = [("match[]", match), ("start", _ts(start)), ("end", _ts(end))]
        body = await self._call(f"/api/v1/label/{label}/values", params, post=False)
        try:
            answer = msgspec.json.decode(body, type=_ListAnswer)
        except msgspec.DecodeError as exc:
            raise PrometheusError(f"{self.base}: not a Prometheus answer ({exc})") from None
        if answer.status != "success" or answer.data is None:
            raise PrometheusError(f"{self.base}: label query refused: {answer.error or 'no data'}")
        return answer.data


def _too_large(detail: str) -> bool:
    lowered = detail.lower()
    return any(words in lowered for words in _TOO_LARGE)


def _ts(t: float) -> str:
    return f"{t:.3f}"
