"""The private and deprecated torch calls Tolk makes, in one place, checked against the torch they were written for.

The CPU products call ops that torch does not document (oneDNN's prepacked linear, `torch.ops.mkldnn`; fbgemm's
`quantized::linear_*`), and int8 models are made with torch.ao's eager dynamic quantization, which torch has
deprecated in favour of torchao. Everything else in Tolk reaches them through the names below, so that a torch
upgrade is checked here: `check` (run at import) warns once, naming what changed, when the installed torch is not a
version the suite ran on (`TESTED`) or an op is missing; a missing op raises with its name when called.

The way off torch.ao's dynamic int8: its only jobs left are `quantize_dynamic` (each linear's int8 weight with one
scale per tensor) and the `QuantizedLinear` type that carries it to `model.projection.stacked_int8`, which already
rebuilds every weight as fbgemm's per-channel tensor and packs it itself. The replacement computes that per-tensor
scale and int8 weight directly (as torch.ao's `MinMaxObserver` does, symmetric, qint8) into a plain module, proven
token for token against today's on both shipped models' test splits, and then torch.ao goes; fbgemm's ops stay, and
with them the quantized-tensor deprecation notices silenced here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

__all__ = ["QuantizedLinear", "check", "int8_weight_bias", "onednn_available", "per_channel_int8",
           "per_tensor_int8", "quantize_dynamic"]

TESTED = ((2, 13),)  # torch (major, minor) versions the suite ran these calls on
M = TypeVar("M", bound=nn.Module)


def _op(namespace: str, name: str) -> Callable[..., Any]:
    """torch.ops.<namespace>.<name>, or a function that raises naming it where this torch lacks it."""
    try:
        return getattr(getattr(torch.ops, namespace), name)  # type: ignore[no-any-return]
    except (AttributeError, RuntimeError):
        def missing(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"torch {torch.__version__} has no torch.ops.{namespace}.{name}, which Tolk's CPU "
                               f"products call (model/torch_ops.py; written for torch {TESTED})")
        missing.unavailable = True  # type: ignore[attr-defined]
        return missing


# oneDNN: a float32 weight reordered once into its packed layout, then products with a fused activation or residual
onednn_reorder = _op("mkldnn", "_reorder_linear_weight")
onednn_linear = _op("mkldnn", "_linear_pointwise")
onednn_linear_add = getattr(onednn_linear, "binary", onednn_linear)
# fbgemm: int8 and float16 weights packed once; products with inputs quantized per call or with a fixed range
linear_prepack = _op("quantized", "linear_prepack")
linear_prepack_fp16 = _op("quantized", "linear_prepack_fp16")
linear_dynamic = _op("quantized", "linear_dynamic")
linear_dynamic_fp16 = _op("quantized", "linear_dynamic_fp16")
linear_fixed_range = _op("quantized", "linear_with_input_q_dq_qweight_dq_output_fp32")


def onednn_available() -> bool:
    """Whether this torch was built with oneDNN and has it enabled."""
    built = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]  # unannotated in torch
    return built and bool(torch.backends.mkldnn.enabled)


def quantize_dynamic(model: M) -> M:
    """The model with its linear layers dynamically quantized to int8 (torch.ao's eager API; see the module's plan)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation notices of torch.ao's eager API; torchao succeeds it
        # unannotated in torch.ao; it returns the model's own type, its linears replaced
        quantized: M = torch.ao.quantization.quantize_dynamic(  # type: ignore[no-untyped-call]
            model, {torch.nn.Linear}, dtype=torch.qint8)
        return quantized


def int8_weight_bias(m: QuantizedLinear) -> tuple[Tensor, Tensor | None]:
    """A dynamically quantized linear's int8 weight and float bias."""
    return m.weight(), m.bias()  # type: ignore[no-untyped-call]  # torch.ao leaves these accessors unannotated


def per_channel_int8(ints: Tensor, scales: Tensor, zero_points: Tensor) -> Tensor:
    """An int8 weight with a scale per output row, as fbgemm's prepack takes it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notice that quantized tensors are deprecated
        return torch._make_per_channel_quantized_tensor(ints, scales, zero_points, 0)


def per_tensor_int8(values: Tensor, scale: float, zero_point: int) -> Tensor:
    """values quantized to int8 with one scale."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's notice that quantized tensors are deprecated
        return torch.quantize_per_tensor(values, scale, zero_point, torch.qint8)


def check() -> list[str]:
    """What differs from the torch these calls were written for; each is also warned about once."""
    found = []
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    if version not in TESTED:
        found.append(f"torch {torch.__version__} is not a version Tolk's private torch calls were tested on "
                     f"({', '.join('.'.join(map(str, v)) for v in TESTED)})")
    for name, op in globals().copy().items():
        if getattr(op, "unavailable", False):
            found.append(f"torch {torch.__version__} lacks the op behind model.torch_ops.{name}")
    for message in found:
        warnings.warn(message + ": model/torch_ops.py", RuntimeWarning, stacklevel=2)
    return found


check()
