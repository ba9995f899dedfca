"""Property: a rendered label selector selects exactly what its requirements mean."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.harness.fake_kube.selectors import labels_match, parse_label_selector

KEYS = ["app", "tier", "example.com/rack", "leaderworkerset.sigs.k8s.io/worker-index"]
VALUES = ["a", "b", "0", "gpu-1", "x.y_z"]

requirement = st.one_of(
    st.tuples(
        st.sampled_from(KEYS),
        st.sampled_from(["=", "==", "!="]),
        st.sampled_from(VALUES).map(lambda v: [v]),
    ),
    st.tuples(
        st.sampled_from(KEYS),
        st.sampled_from(["in", "notin"]),
        st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique=True),
    ),
    st.tuples(st.sampled_from(KEYS), st.sampled_from(["exists", "!"]), st.just([])),
)
labels = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4)


def render(key: str, op: str, values: list[str]) -> str:
    if op in ("in", "notin"):
        return f"{key} {op} ({', '.join(values)})"
    if op == "exists":
        return key
    if op == "!":
        return f"!{key}"
    return f"{key}{op}{values[0]}"


def means(key: str, op: str, values: list[str], have: dict[str, str]) -> bool:
    """apimachinery's semantics, written out independently of the parser."""
    if op in ("=", "==", "in"):
        return have.get(key) in values
    if op in ("!=", "notin"):
        return have.get(key) not in values
    if op == "exists":
        return key in have
    return key not in have


@settings(max_examples=300, deadline=None)
@given(st.lists(requirement, min_size=1, max_size=4), labels)
def test_rendered_selector_matches_its_meaning(reqs, have) -> None:
    text = ",".join(render(*r) for r in reqs)
    expected = all(means(*r, have) for r in reqs)
    assert labels_match(parse_label_selector(text), have) == expected, text
