"""diag's distinct, median and percentile (trace/columns.py) against numpy's own, exactly.

They exist so that the analysis never imports numpy.ma (numpy's np.unique, np.median and
np.percentile ask it on first use: ~10 ms a process, issue #22); their values must be numpy's,
bit for bit, on whatever a trace holds: ints, floats of any scale, NaN, one value, none."""
import math
import warnings

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from diag.trace.columns import distinct, median, percentile

FLOATS = hnp.arrays(np.float64, st.integers(0, 40),
                    elements=st.floats(allow_nan=True, allow_infinity=False, width=64))
FINITE = hnp.arrays(np.float64, st.integers(1, 40),
                    elements=st.floats(-1e15, 1e15, allow_nan=False, allow_infinity=False))
INTS = hnp.arrays(np.int64, st.integers(0, 40), elements=st.integers(-(2 ** 40), 2 ** 40))


def same(a, b) -> bool:
    """Equal as numbers and of the same type, NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
    return (math.isnan(a) and math.isnan(b)) or a == b


@settings(max_examples=400, deadline=None)
@given(st.one_of(FLOATS, INTS))
def test_distinct_is_np_unique(a):
    assert same(distinct(a), np.unique(a))


@settings(max_examples=400, deadline=None)
@given(st.one_of(FLOATS, INTS, FINITE))
def test_median_is_np_median(a):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # numpy's, on an empty input
        assert same(median(a), np.median(a))
        assert same(median(a.tolist()), np.median(a.tolist()))   # lists, as the rank pass passes


@settings(max_examples=400, deadline=None)
@given(st.one_of(FINITE, INTS.filter(len)), st.sampled_from([0, 1, 5, 25, 50, 75, 95, 99, 100, 33.3]))
def test_percentile_is_np_percentile(a, q):
    assert same(percentile(a, q), float(np.percentile(a, q)))


def test_by_hand():
    assert median([3, 1, 2]) == 2.0 and median([4, 1, 3, 2]) == 2.5
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 95) == 48.0        # index 3.8: 40 + 0.8 x 10
    assert percentile([1.0, 2.0], 50) == 1.5 and percentile([7.0], 95) == 7.0
    assert math.isnan(median([1.0, float("nan"), 2.0]))
    assert distinct(np.array([3, 1, 3, 2])).tolist() == [1, 2, 3]
