"""The actions a verdict suggests, shared by the scan's verdicts: what to change, in the user's terms."""

from __future__ import annotations

INVALID_ACTION = ("an invalid operation (square root or log of a negative value, 0/0, inf - inf): check the "
                  "inputs of {type}; a variance taken as E[x^2] - E[x]^2 can go negative in low precision: "
                  "use a two-pass variance or a LayerNorm kernel")


def keep_fp32(op_type: str) -> str:
    """Keep an ill-conditioned op in float32: through the mix list, or a precision mode that does."""
    return (f'keep {op_type} in float32 through the mix list ({{"black-list": {{"to-add": ["{op_type}"]}}}}) '
            "or use a precision mode that keeps it in float32 (allow_mix_precision, must_keep_origin_dtype)")


def listing_short(types: tuple[str, ...]) -> str:
    """The first op types of a sequence, without their ``aten.`` prefix: enough to recognise it."""
    return ", ".join(t.removeprefix("aten.") for t in types[:6]) + (", ..." if len(types) > 6 else "")
