import math

import numpy as np
import pytest

from precision_tool.compare import metrics
from precision_tool.compare.metrics import (FLOAT32_EPS, NO_FINITE_PAIRS, ONE_SIDE_ZERO, PairAccumulator,
                                            compare_arrays, cosine_similarity, finite_range, kl_divergence,
                                            kl_shift, relative_euclidean)


KERNELS = ["c", "numpy"] if metrics._kernel is not None else ["numpy"]


@pytest.fixture(params=KERNELS, autouse=True)
def kernel(request, monkeypatch):
    """Every test here runs on the C kernel (where it is built) and on the numpy path."""
    if request.param == "numpy":
        monkeypatch.setattr(metrics, "_kernel", None)
    return request.param


def msaccucmp_kl(x, y):
    """KL exactly as msaccucmp's alg_KullbackLeiblerDivergence computes it, in float64."""
    def normalized(v):
        v = np.asarray(v, dtype=np.float64)
        span = v.max() - v.min()
        v = (v - v.min()) / span if span != 0 else v
        return np.maximum(v, np.finfo(np.float32).eps)

    p, q = normalized(x), normalized(y)
    p, q = p / p.sum(), q / q.sum()
    result = float((p * np.log(p / q)).sum())
    return 0.0 if abs(result) < np.finfo(np.float32).eps else result


def reference(x, y, floor=np.finfo(np.float64).eps):
    """Every metric straight from its formula, in float64, all at once."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    d = x - y
    rel = np.where(np.abs(y) > floor, np.abs(d) / np.where(np.abs(y) > floor, np.abs(y), 1.0), 0.0)
    return {
        "cosine": float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y))),
        "max_abs_err": float(np.abs(d).max()),
        "max_rel_err": float(rel.max()),
        "mean_abs_err": float(np.abs(d).mean()),
        "mean_rel_err": float(rel.sum() / np.count_nonzero(np.abs(y) > floor)),
        "rmse": float(np.sqrt(np.mean(d * d))),
        "rel_euclidean": float(np.linalg.norm(d) / np.linalg.norm(y)),
        "accumulated_rel_err": float(rel.sum()),
        "kl_divergence": msaccucmp_kl(x, y),
    }


def test_hand_computed_values():
    m = compare_arrays(np.array([1.0, 2.0, 3.0], np.float32), np.array([1.0, 2.0, 4.0], np.float32))
    assert m.count == 3
    assert m.cosine == pytest.approx(17 / math.sqrt(14 * 21), abs=1e-15)
    assert m.max_abs_err == 1.0
    assert m.max_rel_err == 0.25
    assert m.mean_abs_err == pytest.approx(1 / 3, abs=1e-15)
    assert m.mean_rel_err == pytest.approx(0.25 / 3, abs=1e-15)
    assert m.rmse == pytest.approx(math.sqrt(1 / 3), abs=1e-15)
    assert m.rel_euclidean == pytest.approx(1 / math.sqrt(21), abs=1e-15)
    assert m.accumulated_rel_err == 0.25
    assert m.nonfinite_pairs == 0 and m.note == ""


def test_kl_by_hand_matches_msaccucmp():
    # x -> (0, 1/2, 1), floored at eps; y -> (0, 1/3, 1); then each normalised to sum 1
    x, y = [1.0, 2.0, 3.0], [1.0, 2.0, 4.0]
    eps = FLOAT32_EPS
    p = np.array([eps, 0.5, 1.0]) / (eps + 1.5)
    q = np.array([eps, 1 / 3, 1.0]) / (eps + 4 / 3)
    by_hand = float(np.sum(p * np.log(p / q)))
    m = compare_arrays(np.array(x, np.float32), np.array(y, np.float32))
    assert by_hand == pytest.approx(msaccucmp_kl(x, y), rel=1e-12)
    assert m.kl_divergence == pytest.approx(by_hand, rel=1e-12)


def test_identical_tensors_give_exactly_one_and_zero_errors():
    x = np.random.default_rng(1).standard_normal(10_001).astype(np.float32)
    m = compare_arrays(x, x.copy())
    assert m.cosine == 1.0
    assert (m.max_abs_err, m.max_rel_err, m.rmse, m.rel_euclidean, m.kl_divergence) == (0, 0, 0, 0, 0)


def test_both_all_zero_is_cosine_one():
    m = compare_arrays(np.zeros(5, np.float32), np.zeros(5, np.float32))
    assert m.cosine == 1.0 and m.note == ""
    assert m.rel_euclidean == 0.0 and m.max_rel_err == 0.0


@pytest.mark.parametrize("zero_side", ["target", "golden"])
def test_one_side_all_zero_is_nan_with_a_note(zero_side):
    ones, zeros = np.ones(4, np.float32), np.zeros(4, np.float32)
    x, y = (zeros, ones) if zero_side == "target" else (ones, zeros)
    m = compare_arrays(x, y)
    assert math.isnan(m.cosine)
    assert m.note == ONE_SIDE_ZERO
    assert m.max_abs_err == 1.0


def test_golden_all_zero_relative_metrics_follow_msaccucmp():
    m = compare_arrays(np.ones(4, np.float32), np.zeros(4, np.float32))
    assert m.rel_euclidean == 0.0  # ‖y‖ <= eps gives 0
    assert m.max_rel_err == 0.0 and m.mean_rel_err == 0.0  # every |y| is below the floor


def test_opposite_vectors_and_clipping():
    x = np.array([1.0, -2.0, 3.0], np.float32)
    assert compare_arrays(x, -x).cosine == -1.0
    assert cosine_similarity(1.0 + 1e-15, 1.0, 1.0) == (1.0, "")
    assert cosine_similarity(-(1.0 + 1e-15), 1.0, 1.0) == (-1.0, "")


def test_scalar_cosine_is_the_sign_agreement():
    assert compare_arrays(np.float32(2.0), np.float32(3.0)).cosine == 1.0
    assert compare_arrays(np.float32(-2.0), np.float32(3.0)).cosine == -1.0
    assert compare_arrays(np.float32(2.0), np.float32(3.0)).max_rel_err == pytest.approx(1 / 3)


def test_empty_tensors_match():
    m = compare_arrays(np.zeros(0, np.float32), np.zeros(0, np.float32))
    assert (m.count, m.cosine, m.max_abs_err, m.note) == (0, 1.0, 0.0, "")


def test_nonfinite_pairs_are_left_out_and_counted():
    x = np.array([1.0, np.nan, 3.0, np.inf, 5.0], np.float32)
    y = np.array([1.0, 2.0, 3.0, 4.0, np.nan], np.float32)
    m = compare_arrays(x, y)
    assert m.count == 2
    assert m.nonfinite_pairs == 3
    assert m.target_only_nonfinite == 2  # the NaN and the inf; the last pair is the golden side's NaN
    assert m.cosine == 1.0 and m.max_abs_err == 0.0


def test_a_non_finite_target_value_unlike_golden_s_counts_as_the_target_s():
    """+inf against -inf, NaN against inf: non-finite on both sides, yet not golden's value (check fails them)."""
    x = np.array([np.inf, -np.inf, np.nan, np.inf, np.nan, 1.0], np.float32)
    y = np.array([-np.inf, -np.inf, np.inf, np.nan, np.nan, 1.0], np.float32)
    m = compare_arrays(x, y)
    assert (m.count, m.nonfinite_pairs, m.target_only_nonfinite) == (1, 5, 3)


def test_no_finite_pair_gives_nan_with_a_note():
    m = compare_arrays(np.full(3, np.nan, np.float32), np.full(3, np.nan, np.float32))
    assert m.count == 0 and m.nonfinite_pairs == 3 and m.target_only_nonfinite == 0
    assert math.isnan(m.cosine) and m.note == NO_FINITE_PAIRS


def test_relative_errors_skip_golden_values_at_or_below_the_floor():
    x = np.array([1.0, 5.0, 2.2], np.float32)
    y = np.array([0.0, 1e-20, 2.0], np.float32)
    m = compare_arrays(x, y)
    assert m.max_rel_err == pytest.approx(0.1, rel=1e-6)
    assert m.accumulated_rel_err == pytest.approx(0.1, rel=1e-6)
    assert m.mean_rel_err == pytest.approx(0.1, rel=1e-6)  # 0 and 1e-20 are at or below float64 eps
    # with a floor of 1e-30 the 1e-20 golden value counts: |5 - 1e-20| / 1e-20
    wide = compare_arrays(x, y, rel_floor=1e-30)
    assert wide.max_rel_err == pytest.approx(5e20, rel=1e-6)


def test_relative_euclidean_and_kl_edges():
    assert relative_euclidean(4.0, 0.0) == 0.0
    assert relative_euclidean(4.0, 16.0) == 0.5
    assert math.isnan(kl_divergence(1.0, 0.0, 1.0))
    assert kl_divergence(1e-9, 1.0, 1.0) == 0.0  # below float32 eps: snapped to 0
    assert kl_shift(2.0, 2.0) == (0.0, FLOAT32_EPS)  # a constant tensor keeps its values
    assert kl_shift(-1.0, 3.0) == (-1.0, FLOAT32_EPS * 4)


def test_constant_tensors_kl_as_msaccucmp():
    x, y = np.full(4, 3.0, np.float32), np.array([3.0, 3.0, 3.0, 5.0], np.float32)
    assert compare_arrays(x, y).kl_divergence == pytest.approx(msaccucmp_kl(x, y), rel=1e-12)


def test_streamed_in_small_chunks_equals_the_formulas(monkeypatch):
    rng = np.random.default_rng(7)
    y = rng.standard_normal(5000).astype(np.float32)
    x = (y + np.float32(0.05) * rng.standard_normal(5000)).astype(np.float32)
    y[::97] = 0.0
    monkeypatch.setattr(metrics, "BLOCK_ELEMENTS", 64)
    m = compare_arrays(x, y, chunk_elements=333)
    expected = reference(x, y)
    for name, value in expected.items():
        assert getattr(m, name) == pytest.approx(value, rel=1e-12), name


def test_fp16_values_accumulate_in_float64():
    # 2**24 + 1 fp16 ones: a float32 sum stops at 2**24, float64 does not
    n = (1 << 24) + 1
    ones = np.ones(n, np.float32)
    m = compare_arrays(ones, np.zeros(n, np.float32))
    assert m.mean_abs_err == 1.0
    assert m.rmse == 1.0
    assert m.accumulated_rel_err == 0.0


def test_accumulator_rejects_chunks_of_different_sizes():
    accumulator = PairAccumulator((0.0, 1.0), (0.0, 1.0))
    with pytest.raises(ValueError, match="chunk sizes differ"):
        accumulator.update(np.zeros(3), np.zeros(4))


def test_integer_tensors_are_compared_as_numbers():
    m = compare_arrays(np.array([1, 2, 3]), np.array([1, 2, 5]))
    assert m.max_abs_err == 2.0 and m.count == 3


def test_finite_range():
    assert finite_range(np.array([np.nan, -2.0, np.inf, 5.0])) == (-2.0, 5.0)
    assert all(math.isnan(v) for v in finite_range(np.array([np.nan])))
    assert finite_range(np.array([3, 1, 2])) == (1.0, 3.0)


# -- the fast paths: each must give what the plain formulas give ------------------------------------


def bf16_like(values):
    """``values`` rounded to bfloat16 (8 significant bits), in float32."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x8000)) & np.uint32(0xFFFF0000)).view(np.float32)


@pytest.mark.parametrize("case", ["bf16", "noisy", "relu", "independent", "offset", "half_equal", "shifted_equal"])
def test_default_blocks_equal_the_formulas(case):
    # full-size blocks take the atanh series for KL, the equal-block shortcut and the outlier logs
    rng = np.random.default_rng(11)
    y = rng.standard_normal(300_000).astype(np.float32)
    x = {"bf16": lambda: bf16_like(y),
         "noisy": lambda: y + np.float32(1e-3) * rng.standard_normal(y.size).astype(np.float32),
         "relu": lambda: np.maximum(y + np.float32(0.01) * rng.standard_normal(y.size).astype(np.float32), 0),
         "independent": lambda: rng.standard_normal(y.size).astype(np.float32),
         "offset": lambda: y + np.float32(0.25),
         "half_equal": lambda: np.where(np.arange(y.size) < 150_000, y, y * np.float32(1.01)),
         "shifted_equal": lambda: np.where(np.arange(y.size) == 7, np.float32(-9.0), y)}[case]()
    if case == "relu":
        y = np.maximum(y, 0)
    x = np.asarray(x, np.float32)
    m = compare_arrays(x, y, chunk_elements=1 << 17)
    expected = reference(x, y)
    for name, value in expected.items():
        # a KL near 1e-7 is a difference of first-order sums: any float64 evaluation, msaccucmp's included,
        # keeps about 9 digits of it (both are within 1e-9 of an extended-precision value here)
        tolerance = 1e-8 if name == "kl_divergence" else 1e-12
        assert getattr(m, name) == pytest.approx(value, rel=tolerance), name


def test_kl_series_and_logs_agree(monkeypatch):
    # SERIES_MAX = 0 sends every block to numpy's log: the series must agree to float64 rounding
    monkeypatch.setattr(metrics, "_kernel", None)
    series_max = metrics.SERIES_MAX
    rng = np.random.default_rng(12)
    y = rng.standard_normal(200_000).astype(np.float32)
    for x in (bf16_like(y), y + np.float32(0.02) * rng.standard_normal(y.size).astype(np.float32)):
        x = np.asarray(x, np.float32)
        series = PairAccumulator(finite_range(x), finite_range(y))
        series.update(x, y)
        monkeypatch.setattr(metrics, "SERIES_MAX", 0.0)
        logs = PairAccumulator(finite_range(x), finite_range(y))
        logs.update(x, y)
        monkeypatch.setattr(metrics, "SERIES_MAX", series_max)
        assert logs._kl_logs and not series._kl_logs
        assert series.kl_s == pytest.approx(logs.kl_s, rel=1e-13)
        assert (series.kl_u, series.kl_v) == (logs.kl_u, logs.kl_v)


@pytest.mark.parametrize("s", [1e-12, 1e-9, 3e-6, 1e-4, 1e-3, 4e-3, 1.2e-2, 0.025])
def test_atanh_series_terms_keep_float64_accuracy(s):
    terms = metrics._series_terms(s * s)
    u, values = np.ones(2), np.array([s, -s])
    total = metrics._atanh_sum(u.copy(), values, values * values, np.empty(2), terms)
    # odd: +s and -s cancel. A dot with FMA (OpenBLAS's Zen kernels) keeps the exact rounding error of one
    # product s·q instead, at most half an ulp of that term; one ulp of atanh(s) bounds it on any BLAS and CPU
    assert abs(total) <= np.spacing(math.atanh(s))
    one = metrics._atanh_sum(np.ones(1), np.array([s]), np.array([s * s]), np.empty(1), terms)
    assert one == pytest.approx(math.atanh(s), rel=4 * np.finfo(np.float64).eps)


@pytest.mark.parametrize("size", [1, 8191, 8192, 8193, 3 * 8192 + 5])
def test_dot_over_short_rows(size):
    rng = np.random.default_rng(size)
    a, b = rng.standard_normal(size), rng.standard_normal(size)
    assert metrics.row_dot(a, b) == pytest.approx(math.fsum(a * b), rel=1e-12, abs=1e-12)


def test_dump_file_chunks_mapped_into_memory(tmp_path):
    # compare reads float32/float64 tensors of a dump file with pread into a reused buffer
    from precision_tool.compare.comparator import CompareOptions, compare_dumps, compare_sources
    from precision_tool.compare.memory import MemoryDump
    from precision_tool.dump.reader import open_dump

    rng = np.random.default_rng(13)
    arrays = {"float32": rng.standard_normal((37, 101)).astype(np.float32),
              "float64": rng.standard_normal(5003),
              "float16": rng.standard_normal((3, 333)).astype(np.float16).astype(np.float32)}
    golden, target = MemoryDump(role="golden"), MemoryDump(role="target")
    for dtype, values in arrays.items():
        golden.add(f"op_{dtype}", "Op", {"output_0": values}, dtypes={"output_0": dtype})
        scaled = (values * 1.01).astype(np.float16 if dtype == "float16" else values.dtype).astype(values.dtype)
        target.add(f"op_{dtype}", "Op", {"output_0": scaled}, dtypes={"output_0": dtype})
    golden_path, target_path = golden.save(tmp_path / "g.h5"), target.save(tmp_path / "t.h5")
    with open_dump(golden_path) as dump:
        for record, (dtype, values) in zip(dump.ops(), arrays.items()):
            chunks = list(dump.tensor_chunks(0, record.exec_index, "output_0", 1000, mapped=True))
            assert all(chunk.size <= 1000 for chunk in chunks)
            assert np.array_equal(np.concatenate(chunks), np.ravel(values))
            mapped = dtype != "float16"  # fp16 is stored as float16 and widened: a copy
            assert all((chunk.base is not None and not chunk.flags.writeable) == mapped for chunk in chunks)
    from_files = compare_dumps(golden_path, target_path, CompareOptions(chunk_elements=1000))
    in_memory = compare_sources(golden, target, CompareOptions(chunk_elements=1000))
    assert [row.metrics for row in from_files.rows] == [row.metrics for row in in_memory.rows]


# -- the C kernel against the numpy path --------------------------------------------------------------

needs_kernel = pytest.mark.skipif(metrics._kernel is None, reason="the C kernel is not in use (not built, or PRECISION_TOOL_KERNEL=numpy)")


def both_paths(x, y, monkeypatch, chunk_elements=1 << 22):
    with monkeypatch.context() as patch:
        patch.setattr(metrics, "_kernel", None)
        slow = compare_arrays(x, y, chunk_elements=chunk_elements)
    return compare_arrays(x, y, chunk_elements=chunk_elements), slow


@needs_kernel
@pytest.mark.parametrize("kernel", ["c"], indirect=True)
@pytest.mark.parametrize("dtypes", [("float32", "float32"), ("float16", "float32"), ("float32", "float64"),
                                    ("float64", "float32"), ("float64", "float64"), ("bfloat16", "float32"),
                                    ("int32", "int64")])
@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, 3 * 4096 + 11, 100_003])
def test_kernel_equals_numpy_path(dtypes, size, monkeypatch):
    import ml_dtypes

    rng = np.random.default_rng(size)
    y = rng.standard_normal(size) * 3
    x = y + 0.01 * rng.standard_normal(size)
    if "int32" in dtypes:
        x, y = np.round(x * 10), np.round(y * 10)
    x = x.astype(ml_dtypes.bfloat16 if dtypes[0] == "bfloat16" else dtypes[0])
    y = y.astype(dtypes[1])
    fast, slow = both_paths(x, y, monkeypatch, chunk_elements=5000)
    assert fast.count == slow.count == size
    for name in ("cosine", "max_abs_err", "max_rel_err", "mean_abs_err", "mean_rel_err", "rmse", "rel_euclidean",
                 "accumulated_rel_err", "kl_divergence"):
        # KL near 1e-7 keeps about 9 digits in any float64 evaluation (see test_default_blocks_equal_the_formulas)
        tolerance = 1e-8 if name == "kl_divergence" else 1e-11
        assert getattr(fast, name) == pytest.approx(getattr(slow, name), rel=tolerance, abs=1e-300), name
    assert (fast.max_abs_err, fast.max_rel_err) == (slow.max_abs_err, slow.max_rel_err)  # maxima are exact


@needs_kernel
@pytest.mark.parametrize("kernel", ["c"], indirect=True)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_kernel_hands_overflowing_float64_sums_to_numpy(monkeypatch):
    # Σx² of 1e200 overflows float64 in any order: the kernel refuses the chunk, numpy takes it
    x, y = np.array([1e200, 1.0, 2.0]), np.array([1e200, 1.0, 3.0])
    fast, slow = both_paths(x, y, monkeypatch)
    assert fast.count == 3 and fast.max_abs_err == 1.0 == slow.max_abs_err
    assert fast.mean_abs_err == pytest.approx(1 / 3)


@needs_kernel
@pytest.mark.parametrize("kernel", ["c"], indirect=True)
def test_kernel_refuses_nonfinite_chunks_and_bad_operands():
    sums = np.zeros(metrics._N_SUMS)
    args = (0.0, FLOAT32_EPS, 0.0, FLOAT32_EPS, 0.0)
    assert metrics._kernel.pair_sums(np.array([1.0, np.nan], np.float32), np.ones(2, np.float32), sums, *args) == 1
    assert metrics._kernel.pair_sums(np.ones(2, np.float32), np.array([np.inf, 1.0]), sums, *args) == 1
    assert not sums.any()  # a refused chunk adds nothing
    assert metrics._kernel.pair_sums(np.ones(2, np.float32), np.ones(2), sums, *args) == 0
    assert sums[metrics._COUNT] == 2 and sums[metrics._XY] == 2.0
    with pytest.raises(TypeError):
        metrics._kernel.pair_sums(np.ones(2, np.float16), np.ones(2), sums, *args)
    with pytest.raises(ValueError):
        metrics._kernel.pair_sums(np.ones(2), np.ones(3), sums, *args)
    with pytest.raises(ValueError):
        metrics._kernel.pair_sums(np.ones(2), np.ones(2), np.zeros(3), *args)
