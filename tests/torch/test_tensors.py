"""Tensor helpers: statistics, memory order, rounding into formats."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed: pip install 'precision-tool[torch]'")

from precision_tool.dump.layout import dumps  # noqa: E402
from precision_tool.dump.stats import stats_tuple  # noqa: E402
from precision_tool.engine.formats import FLOAT16  # noqa: E402
from precision_tool.torch.ops import args_signature, encode_args  # noqa: E402
from precision_tool.torch.statscache import TensorStatsCache  # noqa: E402
from precision_tool.torch.tensors import (all_finite, array_stats, memory_order,  # noqa: E402
                                          round_in_place, round_to, stats_of)


@pytest.mark.parametrize("values", [
    np.random.default_rng(0).standard_normal(10_000) * 3 + 1,
    np.full(5000, 65504.0),  # saturated, zero variance
    np.r_[np.random.default_rng(1).standard_normal(5000), np.inf, np.nan],
    np.full(8192, 3e30),  # squares beyond float32
    np.arange(7, dtype=np.float64),  # small: the shared helper
])
def test_fast_statistics_agree_with_the_shared_helper(values):
    array = values.astype(np.float32)
    fast, shared = array_stats(array, "float16"), stats_tuple(array, "float16")
    for a, b in zip(fast, shared):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-9)


def _stats_cases():
    rng = np.random.default_rng(5)
    normal = rng.standard_normal(5000)
    saturating = normal.copy()
    saturating[::7] = 65504.0
    with_nan = normal.copy()
    with_nan[3] = np.nan
    return {"normal": normal * 3 + 1, "large": normal * 1e4, "cancelling": np.abs(normal) + 1e3,
            "saturating": saturating, "constant": np.full(300, 2.5), "nan": with_nan, "few": normal[:41],
            "big": rng.standard_normal(70_000), "forty": normal[:40] * 3 + 1, "one": normal[:1],
            "few cancelling": np.abs(normal[:30]) + 1e3, "few saturating": saturating[:36], "few nan": with_nan[:9]}


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("case", list(_stats_cases()))
def test_statistics_read_where_the_tensor_lies_are_those_of_its_float32_values_to_the_bit(dtype, case):
    """The C pass over a tensor's memory (float16/bfloat16 widened as it goes) gives the numpy path's row,
    repr for repr, saturated count included; rows it declines (NaN, cancellation) come from numpy."""
    from precision_tool import native
    from precision_tool.torch.tensors import _stats_where_they_lie, to_numpy

    tensor = torch.from_numpy(_stats_cases()[case]).to(getattr(torch, dtype))
    for logical in ("float32", "float16", "bfloat16"):
        expected = array_stats(to_numpy(tensor), logical)
        assert repr(stats_of(tensor, logical)) == repr(expected)
        here = _stats_where_they_lie(tensor, logical)
        if native.extension is not None and case not in ("nan", "cancelling", "few nan"):
            assert repr(here) == repr(expected)
        else:
            assert here is None
    if case == "saturating" and dtype != "bfloat16":  # (bfloat16 rounds 65504 up to 65536)
        assert stats_of(tensor, "float16")[8] == 715
    if tensor.numel() > 1:
        assert _stats_where_they_lie(tensor[::2], "float32") is None  # strided: numpy's path
    if tensor.numel() >= 6:  # evenly spaced rows (a chunk of the last dimension, an LSTM's gates): gathered in C
        rows = tensor[:tensor.numel() // 3 * 3].reshape(-1, 3)
        for view in (rows[:, 1:], rows[:, :1], rows.reshape(-1, 1, 3)[:, :, 1:], rows[1:, :2]):
            expected = array_stats(to_numpy(view), "float16")
            assert repr(stats_of(view, "float16")) == repr(expected)
            here = _stats_where_they_lie(view, "float16")
            if view.shape[-1] == 1:  # a value a row: a 1-D stride, numpy's path
                assert here is None
            elif native.extension is not None and case in ("normal", "big", "few", "forty", "constant"):
                assert repr(here) == repr(expected)


def test_statistics_of_a_few_values_in_c_are_those_of_math_fsum_to_the_bit():
    """Up to `stats.SMALL_COUNT` values the C pass sums as `stats_tuple` does, with math.fsum (exact, rounded
    once): the same row to the bit, signed zeros of min and max included, on values built to break a
    naive or a reassociated sum."""
    from precision_tool import native
    from precision_tool.dump.stats import SMALL_COUNT, _small_stats
    from precision_tool.torch.tensors import _stats_where_they_lie

    if native.extension is None:
        pytest.skip("the C extension is not built")
    rng = np.random.default_rng(11)
    styles = [lambda n: rng.standard_normal(n), lambda n: 1 + rng.standard_normal(n) * 1e-5,
              lambda n: rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n),
              lambda n: np.full(n, rng.standard_normal()),
              lambda n: rng.choice([0.0, -0.0, 1.0, -1.0, 65504.0, -65504.0, 1e-7, 3e38], n)]
    checked = 0
    for trial in range(1500):
        n = int(rng.integers(1, SMALL_COUNT + 1))
        dtype = ("float32", "float64", "float16", "bfloat16")[trial % 4]
        tensor = torch.from_numpy(styles[trial % len(styles)](n)).to(getattr(torch, dtype))
        if not torch.isfinite(tensor).all():
            continue
        expected = _small_stats(tensor.double().tolist(), dtype)
        got = _stats_where_they_lie(tensor, dtype)
        assert repr(got) == repr(expected), (dtype, tensor)
        checked += 1
    assert checked > 1000
    cancelling = torch.tensor([1e16, 1.0, -1e16, 1e-16, 3.0, 2.0**53, 1.0, 1.0], dtype=torch.float64)
    assert _stats_where_they_lie(cancelling, "float64")[3] * 8 == math.fsum(cancelling.tolist())


def test_statistics_ignore_the_order_of_values_and_reuse_transposes():
    x = torch.randn(64, 80)
    cache = TensorStatsCache()
    assert memory_order(x.t()).is_contiguous() and memory_order(x.t()).data_ptr() == x.data_ptr()
    first = cache.get(x, "float32")
    assert cache.get(x.t(), "float32") is first
    assert stats_of(x.t().contiguous(), "float32")[1:3] == first[1:3]
    x.mul_(2)  # a new version: new statistics
    assert cache.get(x, "float32")[2] == pytest.approx(2 * first[2])


def test_rounding_into_float16_saturates_and_reports_overflow():
    x = torch.tensor([70000.0, 1.0 + 2.0**-12, float("nan")])
    rounded, overflow = round_to(x, FLOAT16, "saturation")
    assert overflow and rounded.tolist() == [65504.0, 1.0, 0.0] and x[0] == 70000.0
    y = x.clone()
    assert round_in_place(y, FLOAT16, "inf_nan") and math.isinf(y[0]) and math.isnan(y[2])
    assert not all_finite(x) and all_finite(torch.ones(3)) and all_finite(torch.arange(3))


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_rounding_in_c_is_bit_for_bit_format_round(name):
    """round_to / round_in_place take the C extension's round16 in range; Format.round is the reference,
    on a stride of all 2**32 float32 patterns (a stride prime to 2: every pattern of the low bits)."""
    from precision_tool.engine.formats import FORMATS
    from precision_tool.torch import tensors

    if tensors._ROUND16 is None:
        pytest.skip("the C extension is not built")
    fmt = FORMATS[name]
    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32)
    bits = np.r_[bits, np.arange(0x33000000, 0x39000000, 1021, dtype=np.uint32)]  # float16's subnormal binades
    values = bits.view(np.float32)
    values = values[np.abs(values) < fmt.overflow_threshold]  # out of range: Format.round itself
    expected, overflow = fmt.round(values.copy(), "saturation")
    assert not overflow
    tensor = torch.from_numpy(values.copy())
    rounded, flag = round_to(tensor, fmt, "saturation")
    assert not flag and np.array_equal(rounded.numpy().view(np.uint32), np.asarray(expected).view(np.uint32))
    assert not round_in_place(tensor, fmt, "saturation")
    assert np.array_equal(tensor.numpy().view(np.uint32), np.asarray(expected).view(np.uint32))
    assert tensor._version == 0  # written where it lies, as the numpy path does
    source = torch.from_numpy(values[:values.size // 2 * 2].copy())
    transposed = source.reshape(2, -1).t()  # a transposed weight: rounded where it lies, into its layout
    rounded, flag = round_to(transposed, fmt, "saturation")
    expected, _ = fmt.round(np.ascontiguousarray(transposed.numpy()), "saturation")
    assert not flag and rounded.shape == transposed.shape and rounded.stride() == transposed.stride()
    assert np.array_equal(rounded.numpy().view(np.uint32), np.asarray(expected).view(np.uint32))
    assert np.array_equal(source.numpy(), values[:values.size // 2 * 2])  # the source is left as it was
    strided = source.reshape(2, -1)[:, ::3]  # not dense: copied contiguous, rounded there
    rounded, flag = round_to(strided, fmt, "saturation")
    expected, _ = fmt.round(np.ascontiguousarray(strided.numpy()), "saturation")
    assert not flag and rounded.is_contiguous() and rounded.shape == strided.shape
    assert np.array_equal(rounded.numpy().view(np.uint32), np.asarray(expected).view(np.uint32))
    assert np.array_equal(source.numpy(), values[:values.size // 2 * 2])


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32"])
def test_rounding_a_view_writes_only_its_own_values_and_keeps_a_transposes_layout(name):
    """A chunk of the last dimension (an LSTM's gates), a transpose, a slice of a 3-D tensor: rounded in C,
    bit for bit as Format.round of their values; in place, the values of the wider tensor between the view's
    rows are left as they were; a transpose's rounded copy keeps its strides."""
    from precision_tool.engine.formats import FORMATS

    fmt = FORMATS[name]
    wide = torch.from_numpy(np.random.default_rng(5).standard_normal((6, 40)).astype(np.float32) * 100)
    for view in (wide[:, 8:24], wide.t(), wide.reshape(6, 4, 10)[:, :, 2:7], wide[1:5, 3:9]):
        expected, _ = fmt.round(np.ascontiguousarray(view.numpy()), "saturation")
        rounded, flag = round_to(view, fmt, "saturation")
        assert not flag and np.array_equal(rounded.numpy(), expected)
        if view.dim() == 2 and view.t().is_contiguous():
            assert rounded.stride() == view.stride()
        copy = wide.clone()
        target = torch.as_strided(copy, view.shape, view.stride(), view.storage_offset())
        assert not round_in_place(target, fmt, "saturation")
        assert np.array_equal(target.numpy(), expected)
        outside = torch.ones_like(copy, dtype=torch.bool)
        torch.as_strided(outside, view.shape, view.stride(), view.storage_offset()).fill_(False)
        assert torch.equal(copy[outside], wide[outside])


def test_statistics_are_shared_by_every_tensor_over_the_same_memory_while_it_lives():
    cache = TensorStatsCache()
    x = torch.randn(6, 8)
    first = cache.get(x.view(48), "float32")  # the view object dies; its storage does not
    assert cache.get(x.view(4, 12), "float32") is first  # another shape over the same values
    assert cache.get(x, "float32") is first
    assert cache.get(x[:3], "float32") is not first and cache.get(x[:3], "float32")[0] == 24
    assert cache.get(x, "float64") is not first  # another logical dtype: its own entry


def test_a_written_tensor_gets_new_statistics_under_its_next_version():
    cache = TensorStatsCache()
    x = torch.ones(10)
    assert cache.get(x, "float32")[2] == 1.0
    x.numpy()[:] *= 3  # as inside the dispatch mode: the values change, the version not yet
    written = cache.written(x, "float32")
    assert written[2] == 3.0
    x.add_(0)  # the version the dispatcher gives it when the op returns
    assert cache.get(x, "float32") is written


def test_the_finite_check_is_exact_for_every_layout_and_magnitude():
    big = torch.full((4, 4), 1e200, dtype=torch.float64)  # squares overflow: checked value by value
    assert all_finite(big) and all_finite(big.t()) and all_finite(torch.full((3,), 3e38))
    for bad in (math.inf, -math.inf, math.nan):
        x = torch.zeros(64, 33)
        x[5, 7] = bad
        assert not all_finite(x) and not all_finite(x.t()) and not all_finite(x[:, 7]) and all_finite(x[:, 8])
        assert not all_finite(x.half()) and not all_finite(x.double())
    assert all_finite(torch.empty(0)) and all_finite(torch.zeros(3, dtype=torch.int64))


@pytest.mark.parametrize("args, kwargs", [
    ((torch.ones(2), 1, 2.5, None, True), {}),
    ((torch.ones(2), [torch.ones(2, dtype=torch.float64), torch.ones(1)], "mean"), {"dim": [0, 1]}),
    ((torch.ones(2),), {"dtype": torch.float16, "device": torch.device("cpu"), "alpha": -0.0}),
])
def test_equal_argument_signatures_mean_equal_encodings(args, kwargs):
    same = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
    assert args_signature(args, kwargs) == args_signature(same, dict(kwargs))
    assert encode_args(args, kwargs)[:2] == encode_args(same, dict(kwargs))[:2]
    other = (args[0].double(), *args[1:])
    assert args_signature(other, kwargs) != args_signature(args, kwargs)
    assert args_signature(args[:1], {"x": args[1:]}) != args_signature((args[0], args[1:]), {})
    assert args_signature(args, {**kwargs, "generator": torch.Generator()}) is None


@pytest.mark.parametrize("one, other", [(1, True), (0.0, -0.0), (1, 1.0)])
def test_arguments_that_compare_equal_but_encode_differently_have_different_signatures(one, other):
    x = torch.ones(2)
    assert dumps(encode_args((x, one), {})[:2]) != dumps(encode_args((x, other), {})[:2])  # as the dump stores them
    assert args_signature((x, one), {}) != args_signature((x, other), {})


def _dense_stats_agree(sparse, dtype="float32"):
    got, want = stats_of(sparse, dtype), stats_tuple(sparse.to_dense().numpy(), dtype)
    assert (got[0], got[6], got[7], got[8]) == (want[0], want[6], want[7], want[8])  # count, nan, inf, saturated
    for a, b in zip(got[1:6], want[1:6]):
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)


@pytest.mark.filterwarnings("ignore::UserWarning")  # (sparse invariant checks off; CSR in beta)
def test_a_sparse_tensor_has_the_statistics_of_the_dense_tensor_it_stands_for():
    # an nn.Embedding(sparse=True) gradient: a few rows, a repeated index summed, the rest zeros
    indices = torch.tensor([[0, 3, 3, 7]])
    values = torch.tensor([[1.0, -2.0], [0.5, 4.0], [0.25, 0.0], [-3.0, 1.5]])
    sparse = torch.sparse_coo_tensor(indices, values, (10, 2))
    assert stats_of(sparse, "float32")[:3] == (20, -3.0, 4.0)  # the zeros widen nothing here: min and max stay
    _dense_stats_agree(sparse)
    _dense_stats_agree(torch.sparse_coo_tensor(indices, values.abs() + 1, (10, 2)))  # positive: the min is a zero
    _dense_stats_agree(torch.sparse_coo_tensor(indices, torch.tensor([[1.0, float("nan")], [2.0, float("inf")],
                                                                       [0.5, 1.0], [1.0, 1.0]]), (10, 2)))
    _dense_stats_agree(torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.long), torch.zeros((0, 2)), (10, 2)))
    _dense_stats_agree(torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.tensor([[1.0, 2.0], [3.0, 4.0]]),
                                               (2, 2)))  # every row stored: no zeros
    _dense_stats_agree(values.to_sparse_csr())
    assert all_finite(sparse) and not all_finite(torch.sparse_coo_tensor(indices[:, :1], torch.tensor(
        [[float("inf"), 0.0]]), (10, 2)))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_an_8_bit_float_has_the_statistics_of_its_values_and_keeps_no_values(dtype):
    from precision_tool.torch.tensors import in_memory, to_numpy

    x = torch.tensor([0.3, -1.7, 2.5, 448.0, 0.0, -0.01]).to(getattr(torch, dtype))
    exact = x.float().numpy()  # every 8-bit value is a float32 value
    np.testing.assert_array_equal(to_numpy(x), exact)
    assert stats_of(x, dtype) == stats_tuple(exact.astype(np.float64))
    assert not in_memory(x)  # no format of a dump holds it: statistics only, in every mode
