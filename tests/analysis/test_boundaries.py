"""Judgements at a boundary: backward ops golden runs and the target does not, stray casts, constants at a limit."""

from __future__ import annotations

import math
from dataclasses import replace

from precision_tool.analysis.departure_verdicts import narrowing_cast, target_only_verdict
from precision_tool.analysis.departures import Departure
from precision_tool.analysis.rewrites import RewriteJudge
from precision_tool.analysis.structure import Consumers, MissingBackward, Rewritten, missing_backward
from precision_tool.dump.records import OpRecord, TensorRecord, TensorStats


def tensor(slot: str, count: int, norm: float = 1.0, dtype: str = "float32", low: float = -1.0,
           high: float = 1.0) -> TensorRecord:
    return TensorRecord(slot, dtype, (count,), TensorStats(count, low, high, norm / count, 0.1, norm))


def op(index: int, name: str, op_type: str, direction: str = "backward", tensors=(), dtype="float32") -> OpRecord:
    return OpRecord(0, index, name, op_type, direction, dtype, False, tuple(tensors))


def module(index: int, name: str, direction: str = "forward") -> OpRecord:
    return op(index, name, "module.Linear", direction)


# ---- modules whose backward the target does not run --------------------------------------------------

def _forward() -> list[OpRecord]:
    return [op(0, "M/a/aten.addmm_0", "aten.addmm", "forward"), module(1, "M/a"),
            op(2, "M/a/sub/aten.relu_0", "aten.relu", "forward"), module(3, "M/a/sub"),
            op(4, "M/b/aten.addmm_0", "aten.addmm", "forward"), module(5, "M/b"), module(6, "M")]


def _golden_backward() -> list[OpRecord]:
    return [op(10, "M/b/aten.addmm_0/aten.mm_0", "aten.mm"), op(11, "M/b/aten.addmm_0/aten.mm_1", "aten.mm"),
            op(12, "M/a/sub/aten.relu_0/aten.threshold_backward_0", "aten.threshold_backward"),
            op(13, "M/a/aten.addmm_0/aten.mm_0", "aten.mm"), op(14, "M/a/aten.addmm_0/aten.clone_0", "aten.clone"),
            op(15, "M/c/aten.addmm_0/aten.mm_0", "aten.mm"), op(16, "M/d/aten.clone_0/aten.clone_0", "aten.clone")]


def test_a_module_whose_backward_the_target_skips_is_listed_once_at_its_outermost_path():
    golden = _forward() + _golden_backward()
    target = _forward() + _golden_backward()[:2]
    found = missing_backward(golden, target)
    # M/a/sub folds into M/a; M/c's forward did not run in the target; M/d's backward only copies
    assert [(m.name, m.golden_ops) for m in found] == [("M/a", ("aten.threshold_backward", "aten.mm"))]
    assert [r.exec_index for r in found[0].golden_records] == [12, 13, 14]


def test_a_module_is_missing_only_where_the_target_runs_none_of_its_backward_ops_or_records_no_modules():
    golden = _forward() + _golden_backward()
    target = _forward() + _golden_backward()[:2] + [op(20, "M/a/aten.addmm_0/aten.mm_0", "aten.mm")]
    assert [m.name for m in missing_backward(golden, target)] == ["M/a/sub"]
    target.append(op(21, "M/a/sub/aten.relu_0/aten.threshold_backward_0", "aten.threshold_backward"))
    assert missing_backward(golden, target) == []
    no_modules = [r for r in golden if not r.is_module]
    assert missing_backward(no_modules, [r for r in no_modules if r.exec_index < 12]) == []


class _Judge(RewriteJudge):
    """The state of one scanned step that `RewriteJudge` reads."""

    def __init__(self, golden, target, missing=(), partners=None):
        self.golden_records, self.step_records = golden, target
        self.consumers = {"backward": Consumers([r for r in golden if r.direction == "backward"])}
        self.missing = list(missing)
        self.pending_missing = list(missing)
        self.partners = partners or {}

    def _golden_of(self, record):
        return self.partners.get(id(record))


def _group(name, golden, target) -> Rewritten:
    return Rewritten(name, "backward", tuple(r.type for r in golden), tuple(r.type for r in target), golden[-1],
                     target[-1], target[0], golden[0], frozenset(("backward", r.name) for r in target))


def test_a_backward_group_without_its_weight_gradients_is_a_kernel_bug_there():
    grad_out = tensor("input_0", 2048, 0.5)
    golden = [op(10, "M/fc/aten.addmm_0/aten.mm_0", "aten.mm", tensors=[grad_out, tensor("output_0", 1024, 0.7)]),
              op(11, "M/fc/aten.addmm_0/aten.mm_1", "aten.mm", tensors=[grad_out, tensor("output_0", 4096, 0.3)]),
              op(12, "M/fc/aten.addmm_0/aten.sum_0", "aten.sum", tensors=[grad_out, tensor("output_0", 64, 0.2)])]
    target = golden[:1]  # the weight and bias do not require grad: only the input gradient is computed
    judge = _Judge(golden, target)
    rewrite = _group("M/fc", golden, target)
    lacking = judge._lacking_results(rewrite)
    assert [(r.name, t.slot) for r, t in lacking] == [("M/fc/aten.addmm_0/aten.mm_1", "output_0"),
                                                      ("M/fc/aten.addmm_0/aten.sum_0", "output_0")]
    assert not judge._feeds_missing(rewrite, lacking)
    verdict = judge._judge_rewrite(rewrite)
    assert (verdict.cls, verdict.op, verdict.direction, verdict.module) == ("kernel_bug", "M/fc", "backward", "M/fc")
    assert "computes 2 gradient(s) there that the target's does not compute at all (mm -> (4096,), " \
           "sum -> (64,))" in verdict.evidence[1]


def test_a_group_that_lacks_only_the_gradient_a_skipped_module_would_read_is_passed_for_that_module():
    grad_out = tensor("input_0", 64, 0.5)
    grad_in = tensor("output_0", 2048, 0.7)
    golden = [op(10, "M/head/aten.addmm_0/aten.mm_0", "aten.mm", tensors=[grad_out, grad_in]),
              op(11, "M/head/aten.addmm_0/aten.mm_1", "aten.mm", tensors=[grad_out, tensor("output_0", 640, 0.3)]),
              op(13, "M/act/aten.silu_0/aten.silu_backward_0", "aten.silu_backward",
                 tensors=[tensor("input_0", 2048, 0.7), tensor("output_0", 2048, 0.4)])]
    target = [op(10, "M/head/aten.addmm_0/aten.mm_0", "aten.mm", tensors=[grad_out, tensor("output_0", 640, 0.3)])]
    missing = [MissingBackward("M/act", ("aten.silu_backward",), (golden[2],))]
    judge = _Judge(golden, target, missing)
    rewrite = _group("M/head", golden[:2], target)
    assert judge._feeds_missing(rewrite, judge._lacking_results(rewrite))
    assert judge._judge_rewrite(rewrite) is None
    verdict = judge._judge_missing_before(None)
    assert (verdict.cls, verdict.op, verdict.direction, verdict.module) == (
        "kernel_bug", "M/act", "backward", "M/act")
    assert verdict.evidence[0] == ("golden's backward runs 1 op(s) in M/act [silu_backward]; the target's runs "
                                   "none there, though both run its forward")


def test_a_skipped_module_whose_golden_gradients_are_all_zero_loses_nothing():
    zero = op(13, "M/act/aten.silu_0/aten.silu_backward_0", "aten.silu_backward",
              tensors=[tensor("input_0", 8, 0.0), tensor("output_0", 8, 0.0)])
    judge = _Judge([zero], [], [MissingBackward("M/act", ("aten.silu_backward",), (zero,))])
    assert judge._judge_missing_before(None) is None
    assert judge.pending_missing == []


def test_a_skipped_module_is_judged_where_the_target_passes_its_place_in_golden_order():
    skipped = op(13, "M/act/aten.silu_0/aten.silu_backward_0", "aten.silu_backward",
                 tensors=[tensor("input_0", 8), tensor("output_0", 8)])
    before, after = op(12, "M/x/aten.mm_0/aten.mm_0", "aten.mm"), op(14, "M/y/aten.mm_0/aten.mm_0", "aten.mm")
    ours_before, ours_after = op(5, before.name, "aten.mm"), op(6, after.name, "aten.mm")
    judge = _Judge([before, skipped, after], [ours_before, ours_after],
                   [MissingBackward("M/act", ("aten.silu_backward",), (skipped,))],
                   {id(ours_before): before, id(ours_after): after})
    assert judge._judge_missing_before(ours_before) is None and len(judge.pending_missing) == 1
    assert judge._judge_missing_before(ours_after).op == "M/act"


# ---- a constant at its format's limit is what golden computes too -------------------------------------

def test_a_constant_at_the_formats_limit_inside_a_rewritten_module_is_no_overflow_unless_it_became_inf():
    lowest = -3.4028234663852886e38
    mask = tensor("output_0", 1, abs(lowest), low=lowest, high=lowest)
    ours = op(3, "M/aten.scalar_tensor_0", "aten.scalar_tensor", "forward", [mask])
    theirs = op(3, "M/aten.scalar_tensor_0", "aten.scalar_tensor", "forward", [mask])
    rewrite = Rewritten("M", "forward", (), (), None, None, members=frozenset({("forward", ours.name)}))
    assert _Judge([theirs], [ours], partners={id(ours): theirs})._first_inside(rewrite) is None
    # only the target writes it: a constant its format holds exactly is no overflow either (a hand-written mask);
    # one its format turned into inf (float32's lowest written to float16) is
    assert _Judge([], [ours])._first_inside(rewrite) is None
    stats = replace(mask.stats, min=math.nan, max=math.nan, norm=math.nan, inf=1)
    inf = op(3, "M/aten.scalar_tensor_0", "aten.scalar_tensor", "forward",
             [replace(mask, dtype="float16", stats=stats)])
    assert _Judge([], [inf])._first_inside(rewrite) == (inf, "overflow", None)


# ---- a cast only the target runs ----------------------------------------------------------------------

def _departure(golden_dtype="float32") -> Departure:
    producer = op(1, "M/act/aten.gelu_0", "aten.gelu", "forward")
    return Departure("input_1", 2e-4, 0, 0, producer, 0.0, None, golden_dtype)


def _cast(index: int, dtype: str) -> OpRecord:
    return op(index, f"M/fc/aten._to_copy_{index}", "aten._to_copy", "forward", [tensor("output_0", 8, dtype=dtype)])


def test_casts_only_the_target_runs_that_round_to_a_narrower_format_are_precision_loss_at_the_narrowing_one():
    down, up = _cast(0, "float16"), _cast(1, "float32")
    d = _departure()
    d = Departure(d.slot, d.error, 0, 0, d.producer, 0.0, up, "float32")
    assert narrowing_cast(d, [down, up]) is down
    reader = op(2, "M/fc/aten.addmm_0", "aten.addmm", "forward")
    verdict = target_only_verdict(reader, d, [down, up])
    assert (verdict.cls, verdict.op, verdict.module) == ("precision_loss", "M/fc/aten._to_copy_0", "M/fc")
    assert verdict.evidence[0] == ("M/fc/aten._to_copy_0 (aten._to_copy), a cast golden does not run, rounds the "
                                   "value to float16; golden keeps it in float32")


def test_target_only_ops_that_compute_or_casts_that_keep_the_format_are_not_a_narrowing_cast():
    d = _departure()
    assert narrowing_cast(d, [_cast(0, "float32")]) is None
    assert narrowing_cast(d, [_cast(0, "float16"), op(1, "M/fc/aten.add_0", "aten.add", "forward")]) is None
    assert narrowing_cast(d, []) is None
    assert narrowing_cast(_departure("float16"), [_cast(0, "bfloat16")]) is not None  # fewer mantissa bits
    assert narrowing_cast(_departure(""), [_cast(0, "float16")]) is None
    assert math.isfinite(d.error)


def test_a_result_laid_out_batch_first_and_flattened_is_found_among_the_axis_orders_of_a_time_major_one():
    import numpy as np

    from precision_tool.analysis.rewrites import relaid

    time_major = np.arange(24, dtype=np.float32).reshape(3, 2, 4)  # (time, batch, features)
    batch_first = time_major.transpose(1, 0, 2).reshape(6, 4)
    orders = list(relaid(batch_first, (3, 2, 4)))
    assert len(orders) == 5  # every order of the 3 axes but the one already tried
    assert sum(np.array_equal(laid, time_major) for laid in orders) == 1
    assert list(relaid(np.zeros(32), (2, 2, 2, 2, 2))) == []  # more than 4 axes: not tried


def test_a_result_laid_out_in_another_order_of_the_targets_own_axes_is_found_among_its_permutations():
    import numpy as np

    from precision_tool.analysis.rewrites import permuted

    heads_first = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)  # (batch, heads, seq, dim)
    seq_first = heads_first.transpose(0, 2, 1, 3).reshape(2, 4, 15)  # golden's (batch, seq, heads * dim)
    orders = list(permuted(heads_first.reshape(-1), (2, 3, 4, 5)))
    assert len(orders) == 23
    assert sum(np.array_equal(laid.reshape(seq_first.shape), seq_first) for laid in orders) == 1
    assert list(permuted(np.zeros(32), (2, 2, 2, 2, 2))) == []


def test_a_constant_asked_for_as_infinity_did_not_overflow_and_one_its_format_turned_into_inf_did():
    from precision_tool.analysis.errors import starts_nonfinite

    out = TensorRecord("output_0", "float32", (), TensorStats(1, math.nan, math.nan, math.nan, math.nan, math.nan,
                                                                inf=1))
    asked = replace(op(0, "attn/aten.scalar_tensor_0", "aten.scalar_tensor", "forward", (out,)),
                    attrs={"args": [{"float": "-inf"}], "kwargs": {}})
    assert starts_nonfinite(asked) is None
    rounded = replace(asked, attrs={"args": [1e39], "kwargs": {}})
    assert starts_nonfinite(rounded) is False
