"""Random draws (analysis/randomness.py): other draws of one distribution end the scan with none; a draw from
another distribution is a kernel_bug. The real-model runs are in tests/realmodels/variation.py (``draws``)."""

import numpy as np
import pytest

from precision_tool.analysis.randomness import is_random_draw, random_draw_verdict, same_distribution
from precision_tool.dump.records import OpRecord, TensorRecord
from precision_tool.dump.stats import tensor_stats


def _mask(seed: int, keep: float, n: int = 1024) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < keep).astype(np.float32)


def _draw(values: np.ndarray, op_type: str = "aten.bernoulli_") -> OpRecord:
    tensors = (TensorRecord("input_0", "float32", values.shape, tensor_stats(np.zeros_like(values)), False),
               TensorRecord("output_0", "float32", values.shape, tensor_stats(values)))
    return OpRecord(0, 3, "GPT2LMHeadModel/transformer/drop/aten.bernoulli__0", op_type, "forward", "float32",
                    False, tensors)


@pytest.mark.parametrize("op_type, drawn", [("aten.bernoulli_", True), ("aten.native_dropout.default", True),
                                            ("aten.randperm", True), ("Dropout", True), ("aten.add", False),
                                            ("aten.normal_.default", True), ("aten.uniform", False), ("", False)])
def test_random_draws_are_known_by_their_op_type(op_type, drawn):
    assert is_random_draw(op_type) is drawn


def test_two_masks_of_one_probability_are_one_distribution_and_of_two_are_not():
    assert same_distribution(tensor_stats(_mask(0, 0.9)), tensor_stats(_mask(1, 0.9)))
    assert not same_distribution(tensor_stats(_mask(0, 0.9)), tensor_stats(_mask(1, 0.8)))
    uniform = np.random.default_rng(2).random(4096).astype(np.float32)
    assert same_distribution(tensor_stats(uniform), tensor_stats(np.random.default_rng(3).random(4096)))
    assert not same_distribution(tensor_stats(uniform), tensor_stats(uniform * 1.2))  # another range
    assert not same_distribution(tensor_stats(uniform), tensor_stats(np.full(4096, np.nan)))


def test_other_masks_are_none_there_and_say_which_seeds():
    golden, target = _draw(_mask(0, 0.9)), _draw(_mask(1, 0.9))
    verdict = random_draw_verdict(target, golden, 0, 1)
    assert (verdict.cls, verdict.op, verdict.module) == ("none", target.name, "GPT2LMHeadModel/transformer/drop")
    assert "the runs are seeded differently (golden 0, target 1)" in verdict.evidence[1]
    assert verdict.evidence[1].startswith("the same distribution (mean 0.890625 against golden's 0.904297)")
    assert "dropout off" in verdict.action
    same_seed = random_draw_verdict(target, golden, 0, 0)
    assert "both runs record the same seed: the target's generator draws another stream" in same_seed.evidence[1]


def test_a_draw_from_another_distribution_is_a_kernel_bug():
    verdict = random_draw_verdict(_draw(_mask(1, 0.8)), _draw(_mask(0, 0.9)), 0, 0)
    assert verdict.cls == "kernel_bug"
    assert verdict.evidence[1] == ("not as two draws of one distribution differ: mean 0.785156 against golden's "
                                   "0.904297, standard deviation 0.410714 against 0.294184")


def test_an_op_that_draws_nothing_or_has_no_golden_partner_is_not_judged_here():
    golden, target = _draw(_mask(0, 0.9), "aten.mul"), _draw(_mask(1, 0.9), "aten.mul")
    assert random_draw_verdict(target, golden, 0, 1) is None
    assert random_draw_verdict(_draw(_mask(1, 0.9)), None, 0, 1) is None
