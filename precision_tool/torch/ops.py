"""What we know about an aten op: its type name, precision category and arguments.

The category map follows the torch / torch_npu autocast lists
(``../shared/reference/NUMERICS.md`` section 1.5) in the engine's terms
(`precision_tool.engine.ops.base`): matrix ops are MATRIX and white, the
autocast fp32 list is black, data movement is MOVEMENT, everything else is a
gray VECTOR op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from precision_tool.engine.ops.base import BLACK, GRAY, MATRIX, MOVEMENT, VECTOR, WHITE
from precision_tool.errors import NotFoundError

_MATRIX = frozenset("""
mm addmm bmm baddbmm addbmm matmul linear mv addmv dot vdot ger outer addr einsum tensordot
convolution _convolution convolution_backward conv1d conv2d conv3d conv_transpose1d conv_transpose2d
conv_transpose3d mkldnn_convolution _addmm_activation chain_matmul linalg_multi_dot
scaled_dot_product_attention _scaled_dot_product_attention_math
_scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
""".split())

_WHITE_VECTOR = frozenset("prelu _prelu_kernel _prelu_kernel_backward".split())

_BLACK = frozenset("""
exp expm1 log log10 log2 log1p reciprocal rsqrt sinh cosh tan acos asin erfinv pow softplus softplus_backward
layer_norm native_layer_norm native_layer_norm_backward group_norm native_group_norm native_group_norm_backward
batch_norm native_batch_norm native_batch_norm_backward _native_batch_norm_legit
_native_batch_norm_legit_functional _native_batch_norm_legit_no_training _batch_norm_with_update
_batch_norm_with_update_functional _batch_norm_no_update batch_norm_backward
frobenius_norm nuclear_norm cosine_similarity dist pdist _pdist_forward cdist _cdist_forward _cdist_backward
renorm logsumexp prod cumprod cumsum linalg_vector_norm linalg_matrix_norm norm sum mean
softmax _softmax _softmax_backward_data log_softmax _log_softmax _log_softmax_backward_data
nll_loss nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward nll_loss_nd cross_entropy_loss
l1_loss smooth_l1_loss smooth_l1_loss_backward huber_loss huber_loss_backward mse_loss mse_loss_backward
kl_div binary_cross_entropy binary_cross_entropy_backward binary_cross_entropy_with_logits
soft_margin_loss soft_margin_loss_backward multilabel_margin_loss_forward multi_margin_loss
poisson_nll_loss margin_ranking_loss hinge_embedding_loss triplet_margin_loss cosine_embedding_loss
""".split())

_MOVEMENT = frozenset("""
view _unsafe_view reshape _reshape_alias t transpose permute expand expand_as squeeze unsqueeze select slice
cat stack hstack vstack split split_with_sizes chunk unbind index index_select gather clone copy copy_
_to_copy to contiguous as_strided flatten narrow repeat embedding select_backward slice_backward
zeros_like ones_like empty_like new_zeros new_ones new_empty zero_ roll flip constant_pad_nd unfold
_unsafe_index movedim diagonal where masked_select index_put index_put_ scatter scatter_ lift_fresh_copy
max_pool1d max_pool2d_with_indices max_pool3d_with_indices expand_copy view_copy permute_copy transpose_copy
t_copy squeeze_copy unsqueeze_copy split_copy slice_copy select_copy _unsafe_split
""".split())

# Ops that carry no data of their own: run, never counted or recorded; an alias keeps its input's format.
_ALIASES = frozenset("detach alias lift_fresh".split())
# ... and ops whose output is uninitialised memory.
_PASSTHROUGH = _ALIASES | frozenset("""
empty empty_like empty_strided new_empty new_empty_strided empty_permuted
_local_scalar_dense is_nonzero item set_ resize_ _resize_output_ sym_size sym_stride sym_numel
sym_storage_offset _has_same_storage_numel is_same_size record_stream _version
""".split())

# record_function markers of the profiler (optimizer.step and backward emit them)
_PASSTHROUGH_NAMESPACES = frozenset({"profiler"})
_COLLECTIVE_NAMESPACES = frozenset({"c10d", "_c10d_functional"})

# Outputs that stay float32 whatever the compute format: softmax statistics of fused attention,
# which kernels keep in their float32 accumulator (PyTorch's own low-precision kernels do the same).
_FLOAT32_OUTPUTS = {
    "_scaled_dot_product_flash_attention_for_cpu": (1,),
    "_scaled_dot_product_flash_attention": (1,),
    "_scaled_dot_product_efficient_attention": (1,),
}

# ... and the arguments (by position) that carry those statistics into backward.
_FLOAT32_INPUTS = {
    "_scaled_dot_product_flash_attention_for_cpu_backward": (5,),
    "_scaled_dot_product_flash_attention_backward": (5,),
    "_scaled_dot_product_efficient_attention_backward": (6,),
}

# In-place ops that overwrite their destination without reading it.
_OVERWRITES = frozenset("""
fill_ zero_ uniform_ normal_ random_ bernoulli_ exponential_ geometric_ cauchy_ log_normal_ copy_
""".split())

# Ops whose output holds exactly the values of their first input (same multiset, same format).
_SAME_VALUES = frozenset("""
clone _unsafe_view _reshape_alias contiguous _to_copy alias_copy view_copy t_copy permute_copy transpose_copy
squeeze_copy unsqueeze_copy lift_fresh_copy detach_copy
""".split())

# Arguments ops write without their schema saying so (no ``(a!)``): the capture copies them before the
# kernel, so that a recorded input holds what the op read (and its statistics agree with its data).
_HIDDEN_WRITES = {
    "native_batch_norm": ("running_mean", "running_var"),  # updated in training mode
    "mkldnn_rnn_layer_backward": ("workspace",),
}

# Ops that conclude an optimizer step from outside it: a loss scaler's update of its scale, called after
# ``scaler.step(optimizer)`` (torch.amp.GradScaler.update). They stay in the step the optimizer ended.
_STEP_TAIL = frozenset("_amp_update_scale_".split())

# A loss scaler's own arithmetic (torch.amp.GradScaler: unscale the gradients and check them, update the
# scale): float32 bookkeeping, as an NPU's loss-scale manager keeps it; computed in float16 the default
# scale 2**16 would itself be inf.
_LOSS_SCALING = frozenset("_amp_foreach_non_finite_check_and_unscale_ _amp_non_finite_check_and_unscale_ "
                          "_amp_update_scale_".split())

# Ops whose autocast policy is "fp32 unless you pass a dtype"; a cast is its own category.
_CASTS = frozenset("_to_copy to".split())


def category_of(opname: str) -> tuple[str, str]:
    """The engine category and default AMP list of an aten op's packet name (``mm``, ``_softmax``)."""
    if opname in _MATRIX:
        return MATRIX, WHITE
    if opname in _WHITE_VECTOR:
        return VECTOR, WHITE
    if opname in _BLACK:
        return VECTOR, BLACK
    if opname in _MOVEMENT:
        return MOVEMENT, GRAY
    return VECTOR, GRAY


@dataclass(frozen=True)
class AtenOp:
    """An op overload and everything the dispatch path asks about it, computed once."""

    func: object
    type: str  # "aten.mm"
    overload: str  # "default"
    category: str
    amp: str
    is_view: bool
    passthrough: bool
    alias: bool  # returns an alias of its first input (detach): keeps its format
    cast: bool
    mutated: tuple[tuple[int, str], ...]  # (position, name) of every argument written in place
    float32_outputs: tuple[int, ...] = ()  # outputs kept in float32 whatever the output format
    float32_args: tuple[int, ...] = ()  # positional arguments never rounded to the compute format
    overwrites: bool = False  # writes its destination without reading it (fill_, uniform_, copy_)
    same_values: bool = False  # its output holds its first input's values (clone, _unsafe_view)
    collective: bool = False  # a torch.distributed collective (c10d): its result arrives when its Work completes
    hidden_writes: tuple[int, ...] = ()  # positions of arguments it writes undeclared (`_HIDDEN_WRITES`)
    step_tail: bool = False  # concludes the optimizer step just ended (`_STEP_TAIL`)
    flags: tuple[tuple[int, str], ...] = ()  # (position, name) of every bool argument (`OpCall.attrs`' "flags")
    loss_scaling: bool = False  # a loss scaler's float32 bookkeeping (`_LOSS_SCALING`)
    arg_names: tuple[str, ...] = ()  # the schema's positional argument names (`OpCall.attrs`' "names")

    def mutated_args(self, args: tuple, kwargs: dict) -> list:
        """The tensors (or tensor lists) this call writes to."""
        found = []
        for position, name in self.mutated:
            value = args[position] if position < len(args) else kwargs.get(name)
            if value is not None:
                found.append(value)
        return found


_INFO: dict = {}


def op_info(func) -> AtenOp:
    """The `AtenOp` of an OpOverload (cached)."""
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = _describe(func)
    return info


def _describe(func) -> AtenOp:
    opname = func._opname
    category, amp = category_of(opname)
    mutated = tuple(
        (i, arg.name) for i, arg in enumerate(func._schema.arguments)
        if arg.alias_info is not None and arg.alias_info.is_write
    )
    collective = func.namespace in _COLLECTIVE_NAMESPACES
    if collective and not mutated and opname.endswith("_") and func._schema.arguments:
        mutated = ((0, func._schema.arguments[0].name),)  # c10d's schemas leave out that allreduce_ writes its tensors
    passthrough = opname in _PASSTHROUGH or func.namespace in _PASSTHROUGH_NAMESPACES
    return AtenOp(func, f"{func.namespace}.{opname}", func._overloadname, category, amp,
                  bool(func.is_view), passthrough, opname in _ALIASES, opname in _CASTS, mutated,
                  _FLOAT32_OUTPUTS.get(opname, ()), _FLOAT32_INPUTS.get(opname, ()), opname in _OVERWRITES,
                  opname in _SAME_VALUES, collective,
                  tuple(i for i, arg in enumerate(func._schema.arguments)
                        if arg.name in _HIDDEN_WRITES.get(opname, ())),
                  opname in _STEP_TAIL,
                  tuple((i, arg.name) for i, arg in enumerate(func._schema.arguments)
                        if str(arg.type) in ("bool", "Optional[bool]")), opname in _LOSS_SCALING,
                  tuple(arg.name for arg in func._schema.arguments if not arg.kwarg_only))


def lookup(op_type: str, overload: str = "default"):
    """The OpOverload ``torch.ops.<namespace>.<name>.<overload>`` of a recorded op type."""
    namespace, _, name = op_type.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), name), overload)
    except (AttributeError, RuntimeError):
        raise NotFoundError(f"{op_type}.{overload} is not an op of this PyTorch ({torch.__version__})") from None


# ---- tensors in arguments and results ----------------------------------------------------------

def flat_tensors(values) -> list:
    """The tensors in ``values`` (nested lists/tuples), in order; None entries are skipped."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def on_meta(args: tuple, kwargs: dict) -> bool:
    """Whether an op runs on the meta device: its first tensor argument lies there (or the first of a list of
    them: an op's tensors share a device), or a factory op is asked for it."""
    first = args[0] if args else None
    if type(first) in (list, tuple) and first:
        first = first[0]
    if isinstance(first, torch.Tensor):
        return first.is_meta
    device = kwargs.get("device") if kwargs else None
    return device is not None and getattr(device, "type", device) == "meta"


def as_float(value, default: float) -> float:
    """A loss or loss scale given to `step` as a float (``default`` for None); a tensor of one value."""
    if value is None:
        return default
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.numel() != 1:
            raise ValueError("the loss must be a number or a one-element tensor")
        return float(value.item())
    return float(value)


def compute_dtype(call) -> str:
    """The dtype an op computes in, as recorded: its first float input's, else its first float output's."""
    for tensors, dtypes in ((call.inputs, call.input_dtypes), (call.outputs, call.output_dtypes)):
        for tensor, dtype in zip(tensors, dtypes or ()):
            if tensor.is_floating_point():
                return dtype
    return dtype_name(call.outputs[0].dtype) if call.outputs else ""


def complete_collective(info: AtenOp, result) -> None:
    """Wait for a collective's work to finish, so that its output tensors hold the result when recorded.

    A c10d op returns at once with a Work handle (``(tensors, work)``); the reduced values arrive when the
    work completes. Waiting here makes the collective synchronous under capture (no overlap of communication
    with the backward pass), which changes no value: the caller waits on the same work later, and a second
    wait returns at once.
    """
    if not info.collective:
        return
    for item in (result if isinstance(result, (list, tuple)) else (result,)):
        if not isinstance(item, (torch.Tensor, list, tuple)) and callable(getattr(item, "wait", None)):
            item.wait()


def result_tensors(info: AtenOp, args: tuple, kwargs: dict, result) -> list:
    """The tensors an op produced: its return values, or the arguments it wrote when it returns nothing."""
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        found = flat_tensors(result)
        if found:
            return found
    return flat_tensors(info.mutated_args(args, kwargs))


# ---- JSON-safe arguments, for replay -----------------------------------------------------------

_ENUMS = (torch.dtype, torch.layout, torch.memory_format)


def encode_args(args: tuple, kwargs: dict) -> tuple[list, dict, list]:
    """``args``/``kwargs`` as JSON-safe values; tensors become ``{"tensor": i, "dtype": ...}`` slots."""
    tensors: list = []
    encoded_args = [_encode(a, tensors) for a in args]
    encoded_kwargs = {k: _encode(v, tensors) for k, v in kwargs.items()}
    return encoded_args, encoded_kwargs, tensors


def _encode(value, tensors: list):
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"tensor": len(tensors) - 1, "dtype": dtype_name(value.dtype)}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, (list, tuple)):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, _ENUMS):
        return {type(value).__name__: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, torch.Generator):
        return None  # the default generator is used on replay
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _encode({torch.SymInt: int, torch.SymFloat: float}.get(type(value), bool)(value), tensors)
    if isinstance(value, complex):
        return {"complex": [value.real, value.imag]}
    return {"repr": repr(value)}


_PLAIN = frozenset({bool, int, float, str, type(None), torch.dtype, torch.layout, torch.memory_format, torch.device})
_TENSOR = object()  # marks a tensor in a signature: no argument can equal it


def args_signature(args: tuple, kwargs: dict) -> tuple | None:
    """A cheap stand-in for ``encode_args(args, kwargs)[:2]``: equal signatures mean equal encodings.

    Tensors become (marker, dtype) and lists tuples; values of the plain
    types become (type, value), floats (float, hex), which compare as their
    encodings do. None
    when some argument is of another type: compare the encodings then.
    """
    try:
        return (tuple([_signature(value) for value in args]),
                tuple([(name, _signature(value)) for name, value in kwargs.items()]) if kwargs else ())
    except _Unsigned:
        return None


class _Unsigned(Exception):
    """An argument `args_signature` does not describe."""


def _signature(value):
    kind = type(value)
    if kind is float:  # 0.0 == -0.0 and nan != nan, but their encodings differ and agree
        return kind, value.hex()
    if kind in _PLAIN:  # with its type: True == 1, but they encode differently
        return kind, value
    if isinstance(value, torch.Tensor):
        return _TENSOR, value.dtype
    if isinstance(value, (list, tuple)):
        return tuple([_signature(v) for v in value])
    raise _Unsigned


def decode_args(encoded_args: list, encoded_kwargs: dict, tensors: list) -> tuple[tuple, dict]:
    """The inverse of `encode_args`, with ``tensors[i]`` in slot ``i``."""
    return (tuple(_decode(a, tensors) for a in encoded_args),
            {k: _decode(v, tensors) for k, v in encoded_kwargs.items()})


def _decode(value, tensors: list):
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if "tensor" in value:
        return tensors[value["tensor"]]
    if "float" in value:
        return float(value["float"])
    for enum in ("dtype", "layout", "memory_format"):
        if enum in value:
            return getattr(torch, value[enum])
    if "device" in value:
        return torch.device(value["device"])
    if "complex" in value:
        return complex(*value["complex"])
    raise ValueError(f"cannot rebuild argument {value.get('repr', value)!r}")


_DTYPE_NAMES: dict = {}


def dtype_name(dtype) -> str:
    """``torch.float16`` -> ``"float16"``."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


def autocast_dtype() -> str:
    """The dtype of an active CPU or CUDA autocast region, else ""."""
    for device in ("cpu", "cuda"):
        try:
            if torch.is_autocast_enabled(device):
                return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
        except (RuntimeError, TypeError):
            continue
    return ""


AUTOCAST_STEP_WARNING = (
    "optimizer.step() runs inside torch.autocast: autocast caches its low-precision copies of the weights "
    "for the whole region, so later forwards in it use stale weights; end the autocast region before the "
    "backward pass and the optimizer step")


class AutocastOptimizerWarning(UserWarning):
    """An optimizer step ran while torch.autocast was active."""
