"""USD cost of model calls from a price table.

Prices are USD per million tokens, per model: ``input`` (uncached prompt tokens), ``cached_input``
(prompt tokens served from the provider's cache; defaults to ``input``), ``cache_write_input`` (prompt tokens written
to the provider's cache, Anthropic's ``cache_creation_input_tokens``; defaults to 1.25 × ``input``) and ``output``.
``Usage.input_tokens`` counts *all* prompt tokens, cached ones included (the OpenAI convention), so the
uncached part is ``input_tokens - cached_tokens``.

A model is looked up by exact name first, then by the longest table entry that is a dash-separated prefix
of it (``gpt-4o-mini-2024-07-18`` → ``gpt-4o-mini``), with a ``<provider>/`` prefix ignored. A model that
is not in the table costs 0 and is *flagged*: `PriceTable.quote` returns ``priced=False``.

Pure data and arithmetic, plus `PriceTable.from_file` which reads one file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError

from loopd.harness._errors import HarnessError
from loopd.harness.core import Frozen, Usage

_PER_MILLION = 1_000_000
_CACHE_WRITE_FACTOR = 1.25  # Anthropic's 5-minute cache writes cost 1.25 × the input price


class ModelPrice(Frozen):
    """USD per million tokens for one model."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write_input: float | None = Field(default=None, ge=0)

    def cost(self, usage: Usage, *, cache_write_tokens: int = 0) -> float:
        """USD of ``usage``; ``cache_write_tokens`` of its (uncached) prompt tokens were written to the cache."""
        cached = min(usage.cached_tokens, usage.input_tokens)
        uncached = usage.input_tokens - cached
        written = min(max(cache_write_tokens, 0), uncached)
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input * _CACHE_WRITE_FACTOR if self.cache_write_input is None else self.cache_write_input
        return (
            (uncached - written) * self.input
            + written * write_price
            + cached * cached_price
            + usage.output_tokens * self.output
        ) / _PER_MILLION


class CostQuote(Frozen):
    """The usage with its cost; ``priced`` is False when the model was not in the table (cost 0)."""

    usage: Usage
    priced: bool
    matched: str | None = None


# USD per million tokens, from the providers' public price pages (2025). Override or extend with LOOPD_PRICES.
_DEFAULT_PRICES: dict[str, tuple[float, float, float]] = {
    # model: (input, cached_input, output)
    "demo": (0.0, 0.0, 0.0),
    "gpt-4o": (2.50, 1.25, 10.00),
    "gpt-4o-mini": (0.15, 0.075, 0.60),
    "gpt-4.1": (2.00, 0.50, 8.00),
    "gpt-4.1-mini": (0.40, 0.10, 1.60),
    "gpt-4.1-nano": (0.10, 0.025, 0.40),
    "gpt-5": (1.25, 0.125, 10.00),
    "gpt-5-mini": (0.25, 0.025, 2.00),
    "gpt-5-nano": (0.05, 0.005, 0.40),
    "o3": (2.00, 0.50, 8.00),
    "o3-mini": (1.10, 0.55, 4.40),
    "o4-mini": (1.10, 0.275, 4.40),
    # Anthropic: cached_input is a cache read (0.1 × input); cache writes default to 1.25 × input.
    "claude-opus-4": (15.00, 1.50, 75.00),
    "claude-opus-4-1": (15.00, 1.50, 75.00),
    "claude-opus-4-5": (5.00, 0.50, 25.00),
    "claude-sonnet-4": (3.00, 0.30, 15.00),
    "claude-sonnet-4-5": (3.00, 0.30, 15.00),
    "claude-haiku-4-5": (1.00, 0.10, 5.00),
    "claude-3-5-haiku": (0.80, 0.08, 4.00),
}


class PriceTableError(HarnessError, ValueError):
    """A price table file or mapping could not be read or validated."""


class PriceTable(Frozen):
    """Per-model prices. Build with `default`, `from_mapping` or `from_file`; combine with `merged`.

    File / mapping shape (JSON or YAML)::

        models:
          gpt-4o-mini: {input: 0.15, cached_input: 0.075, output: 0.60}
          my-local-model: {input: 0, output: 0}
    """

    models: dict[str, ModelPrice] = Field(default_factory=dict)

    @classmethod
    def default(cls) -> PriceTable:
        return cls(
            models={
                name: ModelPrice(input=inp, cached_input=cached, output=out)
                for name, (inp, cached, out) in _DEFAULT_PRICES.items()
            }
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PriceTable:
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise PriceTableError(f"invalid price table: {exc}") from exc

    @classmethod
    def from_file(cls, path: Path | str) -> PriceTable:
        """Read a ``.json``, ``.yaml`` or ``.yml`` price table."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PriceTableError(f"cannot read price table {path}: {exc}") from exc
        try:
            data = json.loads(text) if path.suffix.lower() == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise PriceTableError(f"cannot parse price table {path}: {exc}") from exc
        if not isinstance(data, Mapping):
            raise PriceTableError(f"price table {path} must be a mapping with a 'models' key")
        return cls.from_mapping(data)

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with ``other``'s entries added; ``other`` wins on the same model name."""
        return PriceTable(models={**self.models, **other.models})

    def lookup(self, model: str) -> tuple[str, ModelPrice] | None:
        """The table entry used for ``model``: exact name, else the longest dash-separated prefix."""
        for candidate in _candidates(model):
            price = self.models.get(candidate)
            if price is not None:
                return candidate, price
            best: str | None = None
            for name in self.models:
                if candidate.startswith(name + "-") and (best is None or len(name) > len(best)):
                    best = name
            if best is not None:
                return best, self.models[best]
        return None

    def quote(self, model: str, usage: Usage, *, cache_write_tokens: int = 0) -> CostQuote:
        """``usage`` with ``cost_usd`` set (replacing any cost it had); unknown models cost 0, flagged.

        ``cache_write_tokens``: how many of the prompt tokens were written to the provider's cache (priced at
        ``cache_write_input``)."""
        found = self.lookup(model)
        if found is None:
            return CostQuote(usage=usage.model_copy(update={"cost_usd": 0.0}), priced=False)
        name, price = found
        cost = price.cost(usage, cache_write_tokens=cache_write_tokens)
        return CostQuote(usage=usage.model_copy(update={"cost_usd": cost}), priced=True, matched=name)

    def cost_of(self, model: str, usage: Usage) -> Usage:
        """``usage`` with ``cost_usd`` set; an unknown model costs 0 (use `quote` to see the flag)."""
        return self.quote(model, usage).usage


def _candidates(model: str) -> tuple[str, ...]:
    _, slash, bare = model.rpartition("/")
    return (model, bare) if slash and bare else (model,)
