"""Interval arithmetic against a brute-force set of integer instants."""
import numpy as np
from hypothesis import given, settings, strategies as st

from diag.analysis import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)), max_size=25)


def as_set(pairs):
    out = set()
    for s, n in pairs:
        out.update(range(s, s + n))
    return out


def as_iv(pairs):
    s = np.array([p[0] for p in pairs], dtype=np.int64)
    n = np.array([p[1] for p in pairs], dtype=np.int64)
    return iv.merge(s, s + n)


@settings(max_examples=300, deadline=None)
@given(spans, spans, st.integers(0, 340), st.integers(0, 100))
def test_against_brute_force(a, b, lo, width):
    A, B, sa, sb = as_iv(a), as_iv(b), as_set(a), as_set(b)
    assert iv.length(A) == len(sa)
    assert iv.length(iv.intersect(A, B)) == len(sa & sb)
    assert iv.length(iv.subtract(A, B)) == len(sa - sb)
    U = iv.union(A, B, iv.EMPTY)
    assert iv.length(U) == len(sa | sb) and np.all(U[0][1:] > U[1][:-1])        # merged: sorted, disjoint
    assert iv.length(iv.clip(A, lo, lo + width)) == len({t for t in sa if lo <= t < lo + width})
    got = iv.lengths_in_windows(A, np.array([lo]), np.array([lo + width]))
    assert int(got[0]) == len({t for t in sa if lo <= t < lo + width})


def test_merged_is_sorted_and_disjoint():
    s, e = iv.merge(np.array([5, 0, 3, 20]), np.array([10, 4, 6, 21]))
    assert s.tolist() == [0, 20] and e.tolist() == [10, 21]
