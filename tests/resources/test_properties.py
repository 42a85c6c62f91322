"""Property tests for the pure cores: merge patch, label selectors, schema validation of arbitrary input."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from loopd.resources import TASK_KIND, LabelSelector, ResourceError, builtin_kind_specs
from loopd.resources._patching import merge_patch
from loopd.resources._validation import validate_object

json_scalars = st.none() | st.booleans() | st.integers(-(2**31), 2**31) | st.text(max_size=8)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=5), json_values, max_size=4)
label_keys = st.from_regex(r"\A[a-z][a-z0-9]{0,6}\Z")
label_values = st.from_regex(r"\A[a-z0-9]{0,6}\Z")
labels = st.dictionaries(label_keys, label_values, max_size=5)


@given(json_objects, json_objects)
def test_merge_patch_is_idempotent_and_applies_every_key(target: dict[str, Any], patch: dict[str, Any]) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    for key, value in patch.items():
        if value is None:
            assert key not in once
        elif not isinstance(value, dict):
            assert once[key] == value
    for key in target.keys() - patch.keys():
        assert once[key] == target[key]


@given(labels, st.data())
def test_equality_selectors_built_from_labels_match_them(values: dict[str, str], data: st.DataObject) -> None:
    chosen = data.draw(st.lists(st.sampled_from(sorted(values)), unique=True) if values else st.just([]))
    selector = ",".join(f"{key}={values[key]}" for key in chosen)
    assert LabelSelector.parse(selector).matches(values)
    absent = data.draw(label_keys.filter(lambda key: key not in values))
    assert LabelSelector.parse(f"!{absent}").matches(values)
    assert not LabelSelector.parse(absent).matches(values)
    for key in chosen:
        assert not LabelSelector.parse(f"{key}!={values[key]}").matches(values)
        assert LabelSelector.parse(f"{key} in ({values[key]}, zzz)").matches(values)


@settings(max_examples=300)
@given(json_objects)
def test_arbitrary_input_is_accepted_or_a_typed_error(body: dict[str, Any]) -> None:
    spec = next(s for s in builtin_kind_specs() if s.ref == TASK_KIND)
    candidate = {"metadata": {"name": "t1"}, **body}
    code = 200
    try:
        result = validate_object(spec, candidate, strict=True)
    except ResourceError as exc:
        code = exc.code
    else:
        assert result["spec"]["target"]["key"]
    assert code == 200 or 400 <= code < 500
