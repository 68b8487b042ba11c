"""`analysis.updates.as_read`: golden's value of a tensor carried through the view the target's group read it by."""

from __future__ import annotations

import numpy as np

from precision_tool.analysis.updates import as_read


def test_a_value_read_as_written_is_taken_as_it_is():
    written = np.arange(6, dtype=np.float32).reshape(2, 3)
    golden = written + 0.5
    assert as_read(golden, written, written.copy()) is golden


def test_a_value_read_transposed_is_transposed_and_made_contiguous():
    written = np.arange(6, dtype=np.float32).reshape(2, 3)
    golden = written * 2
    read = as_read(golden, written, written.T.copy())
    assert read.shape == (3, 2) and read.flags.c_contiguous
    np.testing.assert_array_equal(read, golden.T)


def test_a_square_matrix_read_transposed_is_told_by_its_values():
    written = np.arange(9, dtype=np.float32).reshape(3, 3)
    golden = written - 1
    np.testing.assert_array_equal(as_read(golden, written, written.T.copy()), golden.T)
    np.testing.assert_array_equal(as_read(golden, written, written.copy()), golden)


def test_a_reshaped_read_is_reshaped_and_another_tensor_has_no_counterpart():
    written = np.arange(6, dtype=np.float32).reshape(2, 3)
    golden = written * 3
    np.testing.assert_array_equal(as_read(golden, written, written.reshape(6)), golden.reshape(6))
    assert as_read(golden, written, np.ones((2, 3), np.float32)) is None


def test_a_replayed_update_is_judged_against_the_step_golden_took_not_the_parameter():
    from precision_tool.analysis.updates import _update_error

    before = np.full(4, 2.0)
    golden = before + np.array([1e-3, -1e-3, 1e-3, -1e-3])  # an update of 5e-4 of the parameter
    replayed = golden - 2e-4 * before  # a weight decay golden does not apply: 1e-4 of the parameter
    assert _update_error(replayed, golden, before, "float32") == 0.4
    assert abs(_update_error(replayed, golden, None, "float32") - 8e-4 / np.linalg.norm(golden)) < 1e-12
    # no update (a parameter without gradient): against the value
    assert _update_error(golden + 1e-6, golden, golden, "float32") == _update_error(golden + 1e-6, golden, None,
                                                                                    "float32")


def test_a_read_that_splits_and_moves_an_axis_is_followed_through_its_permutation():
    # a Linear's (batch * seq, heads * dim) output read by attention as (batch, heads, seq, dim)
    written = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(6, 20)
    read = written.reshape(2, 3, 4, 5).transpose(0, 2, 1, 3).copy()
    golden = written * 2 + 1
    laid = as_read(golden, written, read)
    assert laid.shape == (2, 4, 3, 5) and laid.flags.c_contiguous
    np.testing.assert_array_equal(laid, golden.reshape(2, 3, 4, 5).transpose(0, 2, 1, 3))
    assert as_read(golden, written, np.ones((2, 4, 3, 5), np.float32)) is None
