"""What ranges cost a node's memory (hecate.model.footprint): the layers said to fit a
budget do fit it, whichever range of that many the plan gives; one more does not fit
somewhere; ranges kept beside what is held never pass the budget; a refusal names the
bytes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hecate.model.footprint import Footprint, fitting

MiB = 1 << 20

footprints = st.builds(
    Footprint,
    blocks=st.lists(st.integers(1, 400 * MiB), min_size=1, max_size=40).map(tuple),
    head=st.integers(0, 600 * MiB),
    kv_per_layer=st.integers(0, 64 * MiB),
    loading=st.integers(0, 900 * MiB),
)


@settings(max_examples=300, deadline=None)
@given(footprints, st.integers(0, 20_000 * MiB))
def test_the_layers_said_to_fit_fit_wherever_the_range_lies(fp: Footprint, budget: int) -> None:
    n = fp.layers_within(budget)
    for a in range(fp.layers - n + 1) if n else ():
        assert fp.need([(a, a + n)]).total <= budget  # the last stage, head and all
    if n < fp.layers:  # one more: some such range, were it to hold the head, would not fit
        wider = [fp.need([(a, a + n + 1)]) for a in range(fp.layers - n)]
        head = [0 if a + n + 1 == fp.layers else fp.head for a in range(fp.layers - n)]
        assert any(w.total + h > budget for w, h in zip(wider, head, strict=True))


@settings(max_examples=300, deadline=None)
@given(fp=footprints, budget=st.integers(0, 20_000 * MiB), data=st.data())
def test_what_is_kept_beside_the_held_fits_and_the_rest_is_refused(
    fp: Footprint, budget: int, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, fp.layers), max_size=6)) | {fp.layers})
    ranges = list(zip([0, *cuts[:-1]], cuts, strict=True))
    given_ = data.draw(st.permutations(ranges))
    held = [r for r in given_ if fp.need([r]).total <= budget][:1]
    keep, refusal = fitting(fp, held, given_, budget, "cgroup")
    assert set(held) <= set(keep)  # what is loaded stays
    assert set(keep) <= set(given_)
    if held or keep != held:
        assert fp.need(keep).total <= budget or keep == held
    if refusal is None:
        assert sorted(keep) == sorted(given_)
    else:
        assert set(refusal.ranges) == set(given_) - set(keep)
        assert refusal.need.total > budget


def test_a_refusal_names_the_bytes_and_where_the_limit_comes_from() -> None:
    fp = Footprint(blocks=(100 * MiB,) * 4, head=50 * MiB, kv_per_layer=MiB, loading=10 * MiB)
    keep, refusal = fitting(fp, [], [(0, 4)], 200 * MiB, "cgroup")
    assert keep == []
    assert refusal is not None
    assert str(refusal) == (
        "layers 0-4 need 464 MiB (weights 450 MiB as held, KV 4 MiB, 10 MiB more while "
        "loading); this node has 200 MiB (cgroup) for them"
    )
    assert fp.layers_within(200 * MiB) == 1  # 100 + 50 + 1 + 10
    assert fp.layer_bytes() == 101 * MiB
