"""What calibration needs from a vLLM OpenAI server: its KV pool, token ids, timed requests.

Prompts are sent as token-id lists (built from ids the engine's own ``/tokenize`` returned), so
their lengths are exact for any model; where each prompt's tokens came from (computed, local
prefix cache, external KV transfer = the host tier) is read from vLLM's
``prompt_tokens_by_source`` counter around each request.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

__all__ = ["EngineError", "EngineInfo", "EngineProbe", "TokenSources"]

#: Text tokenised once to collect valid, ordinary token ids: plain words any BPE vocabulary
#: splits, and ``w<n>`` words (what a word-level test vocabulary holds).
_SEED_TEXT = " ".join(
    [f"w{i}" for i in range(400)]
    + [f"{word}{i}" for i, word in enumerate(("amber", "basil", "cedar", "delta", "ember") * 40)]
)


class EngineError(Exception):
    """The engine is not there, not vLLM, or answered something calibration cannot use."""


@dataclass(frozen=True, slots=True)
class EngineInfo:
    model: str
    max_model_len: int
    block_tokens: int
    gpu_blocks: int

    @property
    def pool_tokens(self) -> int:
        return self.block_tokens * self.gpu_blocks


@dataclass(frozen=True, slots=True)
class TokenSources:
    """Prompt tokens of one request by where they came from (vLLM's own accounting)."""

    computed: float
    local_hit: float
    host: float

    def minus(self, before: TokenSources) -> TokenSources:
        return TokenSources(
            self.computed - before.computed,
            self.local_hit - before.local_hit,
            self.host - before.host,
        )


def _label(line: str, name: str) -> str | None:
    marker = f'{name}="'
    start = line.find(marker)
    if start < 0:
        return None
    start += len(marker)
    return line[start : line.find('"', start)]


class EngineProbe:
    """One engine, over HTTP (``url`` like ``http://127.0.0.1:8000``)."""

    def __init__(self, url: str, timeout_s: float = 120.0, seed: int = 0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s)
        self._rng = random.Random(seed)
        self._ids: list[int] = []
        self.info: EngineInfo | None = None

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str) -> httpx.Response:
        try:
            response = self._client.get(self.url + path)
        except httpx.HTTPError as exc:
            raise EngineError(
                f"engine at {self.url} not reachable ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            raise EngineError(f"engine {self.url}{path} answered HTTP {response.status_code}")
        return response

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            response = self._client.post(self.url + path, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(
                f"engine at {self.url} not reachable ({type(exc).__name__})"
            ) from None
        if response.status_code != 200:
            raise EngineError(
                f"engine {self.url}{path} answered HTTP {response.status_code}: "
                f"{response.text[:200]}"
            )
        return response.json()

    # --- discovery ---------------------------------------------------------------------------

    def discover(self) -> EngineInfo:
        models = self._get("/v1/models").json().get("data") or []
        if not models:
            raise EngineError(f"engine at {self.url} serves no model (/v1/models is empty)")
        model = str(models[0]["id"])
        max_len = int(models[0].get("max_model_len") or 0)
        blocks = block = 0
        for line in self._get("/metrics").text.splitlines():
            if line.startswith("vllm:cache_config_info{"):
                blocks = int(float(_label(line, "num_gpu_blocks") or 0))
                block = int(float(_label(line, "block_size") or 0))
                break
        if blocks <= 0 or block <= 0:
            raise EngineError(
                f"engine at {self.url}: no KV pool size in /metrics (vllm:cache_config_info "
                "with num_gpu_blocks and block_size); is it a vLLM server?"
            )
        if max_len <= 0:
            raise EngineError(f"engine at {self.url}: /v1/models gives no max_model_len")
        ids = self._post("/tokenize", {"model": model, "prompt": _SEED_TEXT,
                                        "add_special_tokens": False}).get("tokens")  # fmt: skip
        unknown = {0}  # word-level vocabularies map unknown words to id 0 (<unk>)
        self._ids = sorted({int(i) for i in ids or []} - unknown)
        if len(self._ids) < 16:
            raise EngineError(f"engine at {self.url}: /tokenize gave too few distinct tokens")
        self.info = EngineInfo(model, max_len, block, blocks)
        return self.info

    # --- prompts and requests ------------------------------------------------------------------

    def tokens(self, n: int) -> list[int]:
        """``n`` random token ids: a prompt no cache has seen."""
        return [self._rng.choice(self._ids) for _ in range(n)]

    def sources(self) -> TokenSources:
        values = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
        for line in self._get("/metrics").text.splitlines():
            if line.startswith("vllm:prompt_tokens_by_source_total{"):
                source = _label(line, "source")
                if source in values:
                    values[source] += float(line.rsplit(" ", 1)[1])
        return TokenSources(
            values["local_compute"], values["local_cache_hit"], values["external_kv_transfer"]
        )

    def ttft(self, prompt: list[int]) -> float:
        """Seconds from sending ``prompt`` to its first streamed token (client side)."""
        assert self.info is not None
        body = {"model": self.info.model, "prompt": prompt, "max_tokens": 1,
                "temperature": 0, "stream": True}  # fmt: skip
        started = time.perf_counter()
        try:
            with self._client.stream("POST", self.url + "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise EngineError(
                        f"engine completion answered HTTP {response.status_code}: "
                        f"{response.text[:200]}"
                    )
                lines = response.iter_lines()
                for line in lines:
                    if line.startswith("data:") and '"choices"' in line:
                        elapsed = time.perf_counter() - started
                        for _rest in lines:
                            pass  # drain, so the next request finds the engine idle
                        return elapsed
        except (httpx.HTTPError, httpx.StreamError) as exc:
            raise EngineError(
                f"engine at {self.url} failed mid-request ({type(exc).__name__})"
            ) from None
        raise EngineError("engine completion stream ended without a token")

    def measured(self, prompt: list[int]) -> tuple[float, TokenSources]:
        """TTFT of ``prompt`` and where its prompt tokens came from."""
        before = self.sources()
        seconds = self.ttft(prompt)
        return seconds, self.sources().minus(before)
