"""The model directory format: load and save, with device and dtype placement.

A model directory holds:
  config.json        ModelConfig
  model.safetensors  weights (never pickle)
  source.spm, target.spm   SentencePiece models (the same file twice for a shared vocabulary)
  info.json          name and languages: {"name": "en-pt", "source_language": "en", "target_language": "pt"}
  generation.json    optional default GenerationConfig fields
  vocab.json         optional list of pieces by model id, when ids are not SentencePiece's own (Marian)
  source_vocab.json  optional: the source side's own list, when it differs from vocab.json's (CTranslate2 imports)
  MODEL_CARD.md      data, licences, recipe, scores, hardware
"""

from __future__ import annotations

import functools
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from safetensors import safe_open
from safetensors.torch import save_model
from torch import Tensor, nn

from model import calibrate, runtime, torch_ops
from model.config import ModelConfig
from model.frozen import FrozenTransformer, freeze
from model.generation import GenerationConfig
from model.tokenizer import Tokenizer
from model.transformer import Transformer

M = TypeVar("M", bound=torch.nn.Module)
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# int8: float32 model whose linear layers are dynamically quantized (CPU). float16w: float32 model whose products
# read float16 weights and compute in float32 (CPU, fbgemm): close to int8's speed for a few rows, float32's
# outputs for weights stored in float16, and a row's result independent of its batch (docs/benchmarks.md)
PRECISIONS = (*DTYPES, "int8", "float16w")
# How int8 products quantize their input. rows: a scale per input row, 7 bits of its own (`model.projection.Rows8`);
# ranges: the fixed input ranges of the model directory's int8.json (`model.calibrate`), fbgemm's products;
# dynamic: one scale per call over the whole batch, fbgemm's dynamic product (a row's result depends on its batch).
INT8_ARITHMETIC = ("rows", "ranges", "dynamic")
CPU_ONLY_PRECISIONS = ("int8", "float16w")
STORAGE_DTYPES = ("float32", "float16")  # of model.safetensors; float16 halves the download, load() upcasts it
REQUIRED_FILES = ("config.json", "model.safetensors", "source.spm", "target.spm", "info.json")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    source_language: str
    target_language: str

    @classmethod
    def load(cls, path: Path) -> ModelInfo:
        data = json.loads(path.read_text())
        return cls(str(data["name"]), str(data["source_language"]), str(data["target_language"]))


@dataclass(frozen=True)
class ModelMeta:
    """Everything of a model directory but its weights: what a process that does not decode needs."""

    path: Path
    info: ModelInfo
    cfg: ModelConfig
    tokenizer: Tokenizer
    generation: GenerationConfig


@dataclass
class LoadedModel:
    """A model ready to translate: the network in eval mode on its device and frozen, its tokenizer and defaults."""

    path: Path
    info: ModelInfo
    model: Transformer
    tokenizer: Tokenizer
    generation: GenerationConfig
    dtype: str
    parameters: int  # counted before quantization (quantized linears hold their weights outside parameters())
    net: FrozenTransformer  # what decoding runs: `model` fused and prepacked, built once at load time
    int8: str | None = None  # int8's arithmetic (INT8_ARITHMETIC), None in other precisions

    @property
    def device(self) -> torch.device:
        return self.model.device


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' picks CUDA when there is one; asking for CUDA without one is an error, not a fallback."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def load_generation_defaults(directory: Path) -> GenerationConfig:
    path = directory / "generation.json"
    if not path.exists():
        return GenerationConfig()
    return GenerationConfig().update(**json.loads(path.read_text()))


def quantize_int8(model: M) -> M:
    """Linear layers (the output projection included) with int8 weights, activations quantized per call.

    On CPUs without fast bf16 this is the quickest precision (see bench/decode.py); its quality cost is
    measured on the test split in docs/benchmarks.md.
    """
    return torch_ops.quantize_dynamic(model)


def read_meta(directory: Path | str) -> ModelMeta:
    """Read a model directory's configuration, tokenizer and defaults, without its weights.

    Raises FileNotFoundError if a file of the format is missing, the weights included.
    """
    directory = Path(directory)
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a model directory: {name} is missing")
    cfg = ModelConfig.load(directory / "config.json")
    vocab_path = directory / "vocab.json"
    vocab = json.loads(vocab_path.read_text()) if vocab_path.exists() else None
    source_path = directory / "source_vocab.json"
    source_vocab = json.loads(source_path.read_text()) if source_path.exists() else None
    tokenizer = Tokenizer.load(directory, cfg.eos_id, cfg.unk_id, vocab, source_vocab=source_vocab,
                               bos_id=cfg.bos_id, add_bos=cfg.add_source_bos, add_eos=cfg.add_source_eos)
    info = ModelInfo.load(directory / "info.json")
    return ModelMeta(directory, info, cfg, tokenizer, load_generation_defaults(directory))


def read_weights(model: nn.Module, path: Path) -> None:
    """Fill a model's parameters and persistent buffers from a safetensors file, one tensor at a time: the file's
    copy is never held whole beside the model's, read into memory or as mapped pages (on an OPUS-MT-size model in
    float32, 296 MB less at the peak than `safetensors.torch.load_model`; reopening the file for each tensor took
    0.2 s of 254 tensors, ad hoc). Stored float16 is cast as it is copied. Tied parameters are stored once
    (`save_model`).

    Raises ValueError naming the tensors that are missing, unexpected or of another shape, before copying any."""
    state = model.state_dict()
    with safe_open(str(path), framework="pt") as f:
        names = set(f.keys())
        unexpected = sorted(names - state.keys())
        stored = {state[n].data_ptr() for n in names & state.keys()}
        missing = sorted(n for n in state.keys() - names if state[n].data_ptr() not in stored)  # not tied to one
        stored_shapes = {n: list(f.get_slice(n).get_shape()) for n in names & state.keys()}
        shapes = sorted(f"{n} {shape} (the model's {list(state[n].shape)})"
                        for n, shape in stored_shapes.items() if shape != list(state[n].shape))
        if unexpected or missing or shapes:
            raise ValueError(f"{path} does not fit the model: missing {missing}, unexpected {unexpected}, "
                             f"other shapes {shapes}")
    with torch.no_grad():
        for name in names:  # the file opened (mapped) anew for each: the pages read leave memory with it
            with safe_open(str(path), framework="pt") as f:
                state[name].copy_(f.get_tensor(name))


def release_linears(modules: Iterable[nn.Module]) -> None:
    """Drop the weights of these linear layers (others are left as they are): `release_linear_weights`."""
    for m in modules:
        if type(m) is nn.Linear:
            m.weight = nn.Parameter(m.weight.detach().new_empty(0), requires_grad=False)
        elif isinstance(m, torch_ops.QuantizedLinear):  # int8: the frozen network packed its own copy of its weights
            m._packed_params.set_weight_bias(_empty_int8(), None)


@functools.cache
def _empty_int8() -> Tensor:
    """The int8 weight a released quantized linear keeps (fbgemm packs no 0-row matrix)."""
    return torch_ops.per_tensor_int8(torch.zeros(1, 1), 1.0, 0)


def release_linear_weights(model: Transformer, net: FrozenTransformer | None = None) -> None:
    """Drop the linear layers' weights from the modules once `freeze` has built the network from them.

    On the CPU the frozen network holds prepacked copies (float32: oneDNN's; int8: fbgemm's, stacked), so the
    modules' weights are a second copy of most of the model (about 290 MB for an OPUS-MT model in float32).
    Afterwards the modules can no longer run, be saved or be frozen again: this is for a process that only decodes.
    The embedding tables go as well where the network keeps them its own way: in int8 (`Int8Table`, int8 with a
    scale per row), or read from the fused step's packed output projection (`PackedTable`, tied tables of large
    models once `FrozenTransformer.release_operator_decoder` ran).
    """
    release_linears(model.modules())
    if net is None:
        return
    for m, table in ((model.src_embed, net.src_table), (model.tgt_embed, net.tgt_table)):
        if not isinstance(table, torch.Tensor):  # kept by the network its own way (in int8, or the fused step's)
            m.weight = nn.Parameter(m.weight.detach().new_empty(0), requires_grad=False)


def int8_arithmetic(directory: Path, int8: str = "auto") -> str:
    """The arithmetic (INT8_ARITHMETIC) that int8 products of this model directory get when asked for `int8`:
    "auto" is "ranges" where the directory has int8.json, else "rows". Raises ValueError for an unknown name, or
    "ranges" without the file."""
    if int8 not in ("auto", *INT8_ARITHMETIC):
        raise ValueError(f"int8 must be 'auto' or one of {INT8_ARITHMETIC}, got {int8!r}")
    has_ranges = (directory / calibrate.RANGES_FILE).is_file()
    if int8 == "ranges" and not has_ranges:
        raise ValueError(f"{directory} has no {calibrate.RANGES_FILE}: measure it with python -m model.calibrate")
    return int8 if int8 != "auto" else "ranges" if has_ranges else "rows"


def load(directory: Path | str, device: str = "auto", dtype: str = "float32",
         keep_modules: bool = True, int8: str = "auto") -> LoadedModel:
    """Load a model directory onto a device ('auto', 'cpu', 'cuda', 'cuda:1') in a dtype ('int8' and 'float16w' on
    the CPU only).

    keep_modules=False keeps the weights once, in the frozen network (`release_linear_weights`): for a process that
    only decodes through `.net`. `int8` picks int8's arithmetic (INT8_ARITHMETIC): "auto" takes the fixed input
    ranges of the directory's int8.json when it has one (`model.calibrate`), and a scale per input row without.
    """
    if dtype not in PRECISIONS:
        raise ValueError(f"dtype must be one of {PRECISIONS}, got {dtype!r}")
    if int8 not in ("auto", *INT8_ARITHMETIC):  # refused in every precision, as a setting
        raise ValueError(f"int8 must be 'auto' or one of {INT8_ARITHMETIC}, got {int8!r}")
    dev = resolve_device(device)
    if dtype in CPU_ONLY_PRECISIONS and dev.type != "cpu":
        raise ValueError(f"dtype {dtype!r} runs on the CPU only")
    meta = read_meta(directory)
    arithmetic = int8_arithmetic(meta.path, int8) if dtype == "int8" else None
    with runtime.loading_heap(dev):
        model, net, parameters = _build(meta, dev, dtype, arithmetic, keep_modules)
        runtime.return_freed_memory()
    return LoadedModel(meta.path, meta.info, model, meta.tokenizer, meta.generation, dtype, parameters, net,
                       arithmetic)


def _build(meta: ModelMeta, dev: torch.device, dtype: str, arithmetic: str | None,
           keep_modules: bool) -> tuple[Transformer, FrozenTransformer, int]:
    """`load`'s model, frozen network and parameter count."""
    model = Transformer(meta.cfg)
    # Whatever the stored dtype (float32, or float16 to ship half the bytes), read_weights copies the weights
    # into this float32 model with a cast: every precision below starts from float32, as if stored so.
    read_weights(model, meta.path / "model.safetensors")
    model = model.to(device=dev, dtype=DTYPES.get(dtype, torch.float32)).eval()
    parameters = model.num_parameters()
    ranges = calibrate.read(meta.path) if arithmetic == "ranges" else None
    rows8 = arithmetic == "rows"
    if arithmetic in ("ranges", "dynamic"):
        model = quantize_int8(model)
    # fuse and prepack the weights now, not on the first request
    net = freeze(model, half=dtype == "float16w", rows8=rows8, defer=not keep_modules,
                 drop=None if keep_modules else release_linears)
    if ranges is not None:
        calibrate.apply(net, ranges)
    if not keep_modules:  # each copy of the modules' weights goes as soon as the network has its own
        released = net.release_operator_decoder()  # large models: the fused step's copy of the decoder is the one
        if net.fused is not None and net.fused.consumed and not released:  # (float32 modules: it always can)
            raise RuntimeError("the fused step took the decoder's weights but cannot take every step")
        net.release_operator_encoder()  # the fused encoder's copy, where it takes every length
        products = net.projections().values()
        release_linears(m for p in products if p.released for m in p.linears)
        for p in products:  # what the operator step and encoder still run, deferred until now (see `freeze`)
            if not p.released:
                p.pack()
                release_linears(p.linears)
        release_linear_weights(model, net)  # (after: the tables go too where the fused step's copy serves them)
    return model, net, parameters


def save(
    directory: Path | str,
    model: Transformer,
    info: ModelInfo,
    source_spm: Path,
    target_spm: Path,
    generation: dict[str, Any] | None = None,
    vocab: list[str] | None = None,
    weights_dtype: str = "float32",
    source_vocab: list[str] | None = None,
) -> None:
    """Write a model directory; the weights as float32 (default) or float16 (`STORAGE_DTYPES`), from the CPU."""
    if weights_dtype not in STORAGE_DTYPES:
        raise ValueError(f"weights_dtype must be one of {STORAGE_DTYPES}, got {weights_dtype!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.cfg.save(directory / "config.json")
    cpu = Transformer(model.cfg)
    cpu.load_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    save_model(cpu.to(DTYPES[weights_dtype]), str(directory / "model.safetensors"))
    for src, name in ((source_spm, "source.spm"), (target_spm, "target.spm")):
        if Path(src).resolve() != (directory / name).resolve():
            shutil.copyfile(src, directory / name)
    (directory / "info.json").write_text(json.dumps(info.__dict__, indent=2) + "\n")
    if generation:
        GenerationConfig().update(**generation)  # refuse invalid defaults before writing them
        (directory / "generation.json").write_text(json.dumps(generation, indent=2) + "\n")
    for pieces, name in ((vocab, "vocab.json"), (source_vocab, "source_vocab.json")):
        if pieces is not None:
            (directory / name).write_text(json.dumps(pieces, ensure_ascii=False) + "\n")
