"""synth.arrays: the sort-based stand-in for np.unique gives np.unique's values."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from synth.arrays import unique_values


@given(arrays(np.int64, st.integers(0, 200), elements=st.integers(-(2 ** 62), 2 ** 62)))
def test_unique_values_is_np_unique(values: np.ndarray) -> None:
    got = unique_values(values)
    assert got.dtype == values.dtype
    assert np.array_equal(got, np.unique(values))


def test_unique_values_of_a_matrix_is_of_its_elements() -> None:
    values = np.array([[3, 1], [3, 2]])
    assert unique_values(values).tolist() == [1, 2, 3]
