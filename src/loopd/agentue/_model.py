"""The AgentUE content model `{version, biz, meta, blocks}` and its blocks, with validation. Pure.

A model is exactly four fields. `version` is "1.1" (or "1.0", which allows inline blocks only); `biz` is a non-empty
domain id renderers use to pick components; `meta` is an open object whose known keys are typed (`error`,
`task_id`, `trace_id`, `stats`) and whose unknown keys are preserved; `blocks` are ordered by position.

A block is either *inline* (`id` and `type` required and non-empty, optional `parent_id` / `group_id`, any other
field belongs to the domain, `ref` is reserved) or a *reference* (exactly `{id, ref}`, version 1.1 only; `ref` is
opaque and application-owned: this module never loads it, `Model.resolve` takes a resolver from the caller).
Block ids are unique within a model. `parent_id` and `group_id` need not name an existing block: blocks stream in
any order and renderers treat a dangling parent as top level.

Models and blocks are immutable values: inputs are copied on the way in and every accessor returns a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

from loopd._infra.jsontext import compact
from loopd.agentue._errors import AgentUEValidationError
from loopd.agentue._json import (
    JsonObject,
    checked_copy,
    checked_object,
    clone,
    describe,
    is_nonempty_str,
    require_nonempty_str,
)

VERSION_1_0 = "1.0"
VERSION_1_1 = "1.1"
PROTOCOL_VERSION = VERSION_1_1
"""The protocol version new models are written in."""
SUPPORTED_VERSIONS = (VERSION_1_1, VERSION_1_0)

MODEL_FIELDS = ("version", "biz", "meta", "blocks")
REFERENCE_FIELDS = frozenset({"id", "ref"})
"""A reference block has exactly these fields; field patches may never target them."""


# --------------------------------------------------------------------------------------------------- meta.error


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """The typed view of `meta.error`: `{code, message, detail?, trace_id?}`."""

    code: str
    message: str
    detail: Any = None
    trace_id: str | None = None

    def __post_init__(self) -> None:
        check_error_object(self.to_json(), "meta.error")

    @classmethod
    def from_json(cls, data: Any, path: str = "meta.error") -> ErrorInfo:
        obj = checked_object(data, path)
        check_error_object(obj, path)
        return cls(code=obj["code"], message=obj["message"], detail=obj.get("detail"), trace_id=obj.get("trace_id"))

    def to_json(self) -> JsonObject:
        out: JsonObject = {"code": self.code, "message": self.message}
        if self.detail is not None:
            out["detail"] = checked_copy(self.detail, "meta.error.detail")
        if self.trace_id is not None:
            out["trace_id"] = self.trace_id
        return out


def check_error_object(value: Any, path: str) -> None:
    """`meta.error` when not null: an object with string `code` and `message`, optional string `trace_id`, any
    `detail`. Other keys are tolerated (and kept)."""
    if not isinstance(value, dict):
        raise AgentUEValidationError(path, f"must be null or an object {{code, message}}, not {describe(value)}")
    for key in ("code", "message"):
        if key not in value:
            raise AgentUEValidationError(f"{path}.{key}", "is required (a string)")
        if not isinstance(value[key], str):
            raise AgentUEValidationError(f"{path}.{key}", f"must be a string, not {describe(value[key])}")
    if value.get("trace_id") is not None and not isinstance(value["trace_id"], str):
        raise AgentUEValidationError(f"{path}.trace_id", f"must be a string, not {describe(value['trace_id'])}")


def check_meta(meta: JsonObject, path: str) -> None:
    """Type the known meta keys; unknown keys are free."""
    if meta.get("error") is not None:
        check_error_object(meta["error"], f"{path}.error")
    for key in ("task_id", "trace_id"):
        if meta.get(key) is not None and not isinstance(meta[key], str):
            raise AgentUEValidationError(f"{path}.{key}", f"must be a string, not {describe(meta[key])}")
    if meta.get("stats") is not None and not isinstance(meta["stats"], dict):
        raise AgentUEValidationError(f"{path}.stats", f"must be an object, not {describe(meta['stats'])}")


# ------------------------------------------------------------------------------------------------------- blocks


def check_inline(data: JsonObject, path: str) -> None:
    """The protocol's rules for an inline block (the caller has already excluded `ref`)."""
    require_nonempty_str(data, "id", path)
    require_nonempty_str(data, "type", path)
    for key in ("parent_id", "group_id"):
        if data.get(key) is not None and not is_nonempty_str(data[key]):
            raise AgentUEValidationError(f"{path}.{key}", f"must be a non-empty string, not {describe(data[key])}")


def _check_reference(data: JsonObject, path: str) -> None:
    extra = sorted(set(data) - REFERENCE_FIELDS)
    if extra:
        raise AgentUEValidationError(
            path, f"a reference block is exactly {{id, ref}}; it may not carry {', '.join(map(repr, extra))}"
        )
    for key in ("id", "ref"):
        require_nonempty_str(data, key, path)


class InlineBlock:
    """A renderable block: non-empty `id` and `type`, optional `parent_id` / `group_id`, domain fields.

    `InlineBlock({"id": "answer", "type": "text", "content": "Hi"})` or `InlineBlock.of("answer", "text",
    content="Hi")`. Field values are returned as copies.
    """

    __slots__ = ("_data", "_text")
    _data: JsonObject
    _text: str | None

    def __init__(self, data: Mapping[str, Any]) -> None:
        obj = checked_object(data, "block")
        if "ref" in obj:
            raise AgentUEValidationError(
                "block.ref", "is reserved for reference blocks; an inline block may not carry it"
            )
        check_inline(obj, "block")
        object.__setattr__(self, "_data", obj)
        object.__setattr__(self, "_text", None)

    @classmethod
    def of(cls, id: str, type: str, **fields: Any) -> InlineBlock:
        return cls({"id": id, "type": type, **fields})

    @classmethod
    def adopt(cls, data: JsonObject) -> InlineBlock:
        """Wrap a dict that was already checked (`check_inline`) and that nobody else holds or changes: no copy, no
        validation. For this package's parser and reducer; anyone else constructs with `InlineBlock(...)`."""
        block = cls.__new__(cls)
        object.__setattr__(block, "_data", data)
        object.__setattr__(block, "_text", None)
        return block

    @property
    def view(self) -> Mapping[str, Any]:
        """The block's fields as a read-only mapping, without a copy (nested values are shared: do not change them;
        `get` and `to_json` return copies)."""
        return MappingProxyType(self._data)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("AgentUE blocks are immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("AgentUE blocks are immutable")

    @property
    def id(self) -> str:
        value: str = self._data["id"]
        return value

    @property
    def type(self) -> str:
        value: str = self._data["type"]
        return value

    @property
    def parent_id(self) -> str | None:
        value: str | None = self._data.get("parent_id")
        return value

    @property
    def group_id(self) -> str | None:
        value: str | None = self._data.get("group_id")
        return value

    @property
    def fields(self) -> tuple[str, ...]:
        """The field names present, in order."""
        return tuple(self._data)

    def get(self, field: str, default: Any = None) -> Any:
        """A copy of one field's value (`default` when absent; a present `null` is returned as None)."""
        return clone(self._data[field]) if field in self._data else default

    def __contains__(self, field: object) -> bool:
        return field in self._data

    def to_json(self) -> JsonObject:
        data: JsonObject = clone(self._data)
        return data

    def json_text(self) -> str:
        """The block as compact JSON text (`to_json`'s value), made once per block: a block never changes, and a
        model's text is its blocks' texts joined (`Model.json_text`), so re-encoding a long answer after each
        event costs only its new blocks."""
        text = self._text
        if text is None:
            text = compact_json(self._data)
            object.__setattr__(self, "_text", text)
        return text

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, InlineBlock):
            return NotImplemented
        return self._data == other._data

    __hash__ = None  # type: ignore[assignment]  # equality is by (mutable-typed) content

    def __repr__(self) -> str:
        return f"InlineBlock({self._data!r})"


@dataclass(frozen=True, slots=True)
class RefBlock:
    """A reference block: exactly `{id, ref}`; `ref` is opaque and owned by the application (version 1.1 only)."""

    id: str
    ref: str

    def __post_init__(self) -> None:
        _check_reference({"id": self.id, "ref": self.ref}, "block")

    def to_json(self) -> JsonObject:
        return {"id": self.id, "ref": self.ref}

    def json_text(self) -> str:
        """The block as compact JSON text."""
        return compact_json(self.to_json())


Block = InlineBlock | RefBlock


def compact_json(value: Any) -> str:
    """Checked JSON (what this package's parsers accept) as compact text: no whitespace, UTF-8 as is."""
    return compact(value)


def parse_block(data: Any, path: str = "block") -> Block:
    """Validate a JSON block: any `ref` key makes it a reference block, otherwise it is inline."""
    return block_from_owned(checked_object(data, path), path)


def block_from_owned(obj: JsonObject, path: str) -> Block:
    """`parse_block` for a dict this module already copied (no second copy)."""
    if "ref" in obj:
        _check_reference(obj, path)
        return RefBlock(obj["id"], obj["ref"])
    check_inline(obj, path)
    return InlineBlock.adopt(obj)


def block_json(block: Block | Mapping[str, Any]) -> Any:
    """The JSON of a block object, or the mapping itself (validated later by whoever consumes it)."""
    return block.to_json() if isinstance(block, InlineBlock | RefBlock) else block


# -------------------------------------------------------------------------------------------------------- model


def _parse_model(data: Any, path: str) -> tuple[str, str, JsonObject, tuple[Block, ...]]:
    if not isinstance(data, Mapping):
        raise AgentUEValidationError(
            path, f"must be a JSON object {{version, biz, meta, blocks}}, not {describe(data)}"
        )
    missing = [name for name in MODEL_FIELDS if name not in data]
    if missing:
        raise AgentUEValidationError(path, f"missing required field(s): {', '.join(missing)}")
    unknown = sorted(str(name) for name in data if name not in MODEL_FIELDS)
    if unknown:
        raise AgentUEValidationError(
            path, f"unknown field(s) {', '.join(map(repr, unknown))}; a model is exactly {{version, biz, meta, blocks}}"
        )
    version = data["version"]
    if not isinstance(version, str) or version not in SUPPORTED_VERSIONS:
        raise AgentUEValidationError(
            f"{path}.version", f"unsupported version {version!r}; expected '1.1' (or '1.0', inline blocks only)"
        )
    biz = data["biz"]
    if not is_nonempty_str(biz):
        raise AgentUEValidationError(f"{path}.biz", f"must be a non-empty string, not {describe(biz)}")
    meta = checked_object(data["meta"], f"{path}.meta")
    check_meta(meta, f"{path}.meta")
    raw_blocks = data["blocks"]
    if not isinstance(raw_blocks, list | tuple):
        raise AgentUEValidationError(f"{path}.blocks", f"must be an array, not {describe(raw_blocks)}")
    blocks: list[Block] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(raw_blocks):
        where = f"{path}.blocks[{index}]"
        block = parse_block(block_json(raw), where)
        if isinstance(block, RefBlock) and version == VERSION_1_0:
            raise AgentUEValidationError(where, "block references need version 1.1; a 1.0 model has inline blocks only")
        if block.id in seen:
            raise AgentUEValidationError(
                f"{where}.id", f"duplicate block id {block.id!r} (also at blocks[{seen[block.id]}])"
            )
        seen[block.id] = index
        blocks.append(block)
    return version, biz, meta, tuple(blocks)


class Model:
    """An AgentUE content model `{version, biz, meta, blocks}` (immutable, validated)."""

    __slots__ = ("_biz", "_blocks", "_ids", "_meta", "_version")
    _version: str
    _biz: str
    _meta: JsonObject
    _blocks: tuple[Block, ...]
    _ids: dict[str, int] | None
    """Block id → position, built on the first lookup (see `index_of`); never changed once built."""

    def __init__(
        self,
        *,
        biz: str,
        version: str = PROTOCOL_VERSION,
        meta: Mapping[str, Any] | None = None,
        blocks: Iterable[Block | Mapping[str, Any]] = (),
    ) -> None:
        data = {"version": version, "biz": biz, "meta": {} if meta is None else meta, "blocks": list(blocks)}
        self._assign(*_parse_model(data, "model"))

    @classmethod
    def from_json(cls, data: Any, *, path: str = "model") -> Model:
        """Validate a JSON model; raises `AgentUEValidationError` naming the offending path."""
        model = cls.__new__(cls)
        model._assign(*_parse_model(data, path))
        return model

    @classmethod
    def from_stored(cls, data: Any, *, path: str = "model") -> Model:
        """A model decoded from JSON that a validated model wrote (its `json_text` or `to_json`, stored and read back):
        the model's own fields are checked, its blocks are adopted as they are (no deep copy, no block checks) —
        ``data`` must be fresh from the decoder, held by nobody else. About ten times cheaper than `from_json` for a
        long answer; anything not written from a valid model goes through `from_json`."""
        if not isinstance(data, dict) or set(data) != set(MODEL_FIELDS):
            return cls.from_json(data, path=path)
        version, biz, meta, raw_blocks = data["version"], data["biz"], data["meta"], data["blocks"]
        if version not in SUPPORTED_VERSIONS or not is_nonempty_str(biz) or not isinstance(meta, dict):
            return cls.from_json(data, path=path)
        if not isinstance(raw_blocks, list) or not all(isinstance(raw, dict) for raw in raw_blocks):
            return cls.from_json(data, path=path)
        blocks = tuple(
            RefBlock(raw["id"], raw["ref"]) if "ref" in raw else InlineBlock.adopt(raw) for raw in raw_blocks
        )
        model = cls.__new__(cls)
        model._assign(version, biz, meta, blocks)
        return model

    @classmethod
    def adopt(cls, version: str, biz: str, meta: JsonObject, blocks: tuple[Block, ...]) -> Model:
        """Assemble from parts that are already valid and that nobody else holds or changes: no copy, no validation.
        For this package's reducer; anyone else constructs with `Model(...)` or `Model.from_json`."""
        model = cls.__new__(cls)
        model._assign(version, biz, meta, blocks)
        return model

    def with_blocks(self, blocks: tuple[Block, ...]) -> Model:
        """This model with ``blocks`` instead of its own, sharing its meta: no copy, no validation (the caller keeps
        the ids unique and the blocks valid for the version). For this package's reducer."""
        return Model.adopt(self._version, self._biz, self._meta, blocks)

    def with_block_at(self, index: int, block: Block) -> Model:
        """This model with ``block`` at ``index`` (an existing position: replaced; one past the end: appended),
        sharing its meta; no validation (the caller keeps the ids unique: ``block`` replaces the block of its own
        id, or its id is new). The id index carries over, so a long model's lookups stay dictionary lookups. For
        this package's reducer."""
        blocks = self._blocks
        ids = self._ids
        if index == len(blocks):
            model = Model.adopt(self._version, self._biz, self._meta, (*blocks, block))
            if ids is not None:
                ids = dict(ids)
                ids[block.id] = index
        else:
            model = Model.adopt(self._version, self._biz, self._meta, (*blocks[:index], block, *blocks[index + 1 :]))
        object.__setattr__(model, "_ids", ids)  # a replacement keeps every position: the same (unchanging) index
        return model

    @property
    def meta_view(self) -> Mapping[str, Any]:
        """`meta` as a read-only mapping, without a copy (nested values are shared: do not change them)."""
        return MappingProxyType(self._meta)

    def _assign(self, version: str, biz: str, meta: JsonObject, blocks: tuple[Block, ...]) -> None:
        object.__setattr__(self, "_version", version)
        object.__setattr__(self, "_biz", biz)
        object.__setattr__(self, "_meta", meta)
        object.__setattr__(self, "_blocks", blocks)
        object.__setattr__(self, "_ids", None)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("AgentUE models are immutable")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("AgentUE models are immutable")

    @property
    def version(self) -> str:
        return self._version

    @property
    def biz(self) -> str:
        return self._biz

    @property
    def meta(self) -> JsonObject:
        """A copy of `meta`."""
        value: JsonObject = clone(self._meta)
        return value

    @property
    def blocks(self) -> tuple[Block, ...]:
        return self._blocks

    @property
    def error(self) -> ErrorInfo | None:
        """`meta.error` as a typed value (None when absent or null)."""
        raw = self._meta.get("error")
        return None if raw is None else ErrorInfo.from_json(raw)

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(block.id for block in self._blocks)

    def index_of(self, block_id: str) -> int | None:
        ids = self._ids
        if ids is None:
            ids = {block.id: index for index, block in enumerate(self._blocks)}
            object.__setattr__(self, "_ids", ids)
        return ids.get(block_id)

    def block(self, block_id: str) -> Block | None:
        index = self.index_of(block_id)
        return None if index is None else self._blocks[index]

    def references(self) -> tuple[RefBlock, ...]:
        """The reference blocks still to be resolved, in order."""
        return tuple(block for block in self._blocks if isinstance(block, RefBlock))

    def children(self, parent_id: str) -> tuple[InlineBlock, ...]:
        """Inline blocks whose `parent_id` is `parent_id`, in order."""
        return tuple(b for b in self._blocks if isinstance(b, InlineBlock) and b.parent_id == parent_id)

    def group(self, group_id: str) -> tuple[InlineBlock, ...]:
        """Inline peer blocks sharing `group_id`, in order."""
        return tuple(b for b in self._blocks if isinstance(b, InlineBlock) and b.group_id == group_id)

    def empty_like(self) -> Model:
        """Same version and biz, empty meta and no blocks (a responder's initial content)."""
        return Model.adopt(self._version, self._biz, {}, ())

    def resolve(self, resolver: Callable[[RefBlock], InlineBlock | Mapping[str, Any] | None]) -> Model:
        """Replace every reference block by what `resolver` returns for it, keeping positions.

        The resolution must be a complete inline block with the same id and no `ref`; anything else (including an
        empty body) raises `AgentUEValidationError`. Errors raised by `resolver` propagate unchanged.
        """
        if not any(isinstance(block, RefBlock) for block in self._blocks):
            return self
        resolved: list[Block] = []
        for block in self._blocks:
            if isinstance(block, RefBlock):
                where = f"resolution of block {block.id!r}"
                body = resolver(block)
                if body is None or (isinstance(body, Mapping) and not body):
                    raise AgentUEValidationError(where, "a failed resolution is not an empty body")
                obj = checked_object(block_json(body), where)
                if "ref" in obj:
                    raise AgentUEValidationError(where, "must be an inline block (it still carries ref)")
                check_inline(obj, where)
                if obj["id"] != block.id:
                    raise AgentUEValidationError(where, f"returned block id {obj['id']!r}, expected {block.id!r}")
                resolved.append(InlineBlock.adopt(obj))
            else:
                resolved.append(block)
        return Model.adopt(self._version, self._biz, self._meta, tuple(resolved))

    def to_json(self) -> JsonObject:
        return {
            "version": self._version,
            "biz": self._biz,
            "meta": clone(self._meta),
            "blocks": [block.to_json() for block in self._blocks],
        }

    def json_text(self) -> str:
        """`to_json` as compact JSON text, without copying the model: each block's text is made once and kept
        (`InlineBlock.json_text`), so storing a growing answer after every event encodes only what changed."""
        blocks = ",".join(block.json_text() for block in self._blocks)
        return (
            f'{{"version":{compact_json(self._version)},"biz":{compact_json(self._biz)},'
            f'"meta":{compact_json(self._meta)},"blocks":[{blocks}]}}'
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Model):
            return NotImplemented
        return (self._version, self._biz, self._meta, self._blocks) == (
            other._version,
            other._biz,
            other._meta,
            other._blocks,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Model({self.to_json()!r})"
