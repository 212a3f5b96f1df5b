"""CTranslate2's files as they are on disk: model.bin (a binary version, the spec's name and revision, named tensors,
then aliases), the vocabularies beside it and the SentencePiece model(s). Read directly, without ctranslate2;
model/ct2_import.py maps what is read onto Tolk's Transformer."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from model.marian_format import UnsupportedCheckpoint

DTYPES: dict[int, Any] = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16, 5: np.uint16}
ITEM_DTYPES: dict[int, Any] = {4: np.float32, 2: np.int16, 1: np.int8}  # binary versions 1-3 give item sizes


def read_model_bin(path: Path) -> tuple[str, int, dict[str, Tensor]]:
    """model.bin -> (spec name, spec revision, {name: tensor}), aliases resolved, tensors as stored."""
    data = path.read_bytes()
    at = 0

    def take(n: int) -> bytes:
        nonlocal at
        if at + n > len(data):
            raise UnsupportedCheckpoint(f"{path} is truncated ({len(data)} bytes, needs more than {at + n})")
        at += n
        return data[at - n : at]

    def number(fmt: str) -> int:
        return int(struct.unpack("<" + fmt, take(struct.calcsize(fmt)))[0])

    def string() -> str:
        return take(number("H"))[:-1].decode("utf-8")

    version = number("I")
    if not 1 <= version <= 6:
        raise UnsupportedCheckpoint(f"{path}: binary version {version} is not one this import reads (1 to 6)")
    spec, revision = (string(), number("I")) if version >= 2 else ("TransformerSpec", 1)
    variables: dict[str, Tensor] = {}
    for _ in range(number("I")):
        name = string()
        shape = [number("I") for _ in range(number("B"))]
        if version >= 4:
            dtype = DTYPES.get(number("B"))
            size = number("I")
        else:
            item = number("B")
            dtype, size = ITEM_DTYPES.get(item), number("I") * item
        if dtype is None:
            raise UnsupportedCheckpoint(f"{path}: variable {name} has a data type this import does not know")
        array = np.frombuffer(take(size), dtype=dtype).reshape(shape)
        tensor = torch.from_numpy(array.copy())
        variables[name] = tensor.view(torch.bfloat16) if dtype is np.uint16 else tensor
    if version >= 3:
        for _ in range(number("I")):
            alias, target = string(), string()
            for suffix in ("", "_scale"):  # a quantized variable's alias shares its scale, as CTranslate2 does
                if target + suffix in variables:
                    variables[alias + suffix] = variables[target + suffix]
    return spec, revision, variables


def dequantized(variables: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every float variable as float32, quantized weights divided by their scales; scalars kept as they are."""
    out: dict[str, Tensor] = {}
    for name, value in variables.items():
        if name.endswith("_scale") and name[: -len("_scale")] in variables:
            continue
        scale = variables.get(name + "_scale")
        if scale is not None and value.dim() > 0:
            scale = scale.float()
            value = value.float() / (scale[:, None] if scale.dim() == 1 else scale)
        elif value.is_floating_point():
            value = value.float()
        out[name] = value
    return out


def read_vocabularies(directory: Path) -> tuple[list[str], list[str]]:
    """The source and target vocabularies (the same list twice when shared)."""

    def read(side: str) -> list[str] | None:
        if (directory / f"{side}_vocabulary.json").is_file():
            return [str(t) for t in json.loads((directory / f"{side}_vocabulary.json").read_text(encoding="utf-8"))]
        if (directory / f"{side}_vocabulary.txt").is_file():
            return (directory / f"{side}_vocabulary.txt").read_text(encoding="utf-8").rstrip("\n").split("\n")
        return None

    shared = read("shared")
    if shared is not None:
        return shared, shared
    source, target = read("source"), read("target")
    if (directory / "source_vocabulary_1.json").is_file() or (directory / "source_vocabulary_1.txt").is_file():
        raise UnsupportedCheckpoint("the model has several source vocabularies (source features)")
    if source is None or target is None:
        raise FileNotFoundError(f"{directory}: no shared_vocabulary.json/.txt, nor source_ and target_vocabulary")
    return source, target


def find_spm(directory: Path) -> tuple[Path, Path]:
    """The source and target SentencePiece models: source.spm and target.spm, else one shared *.model."""
    if (directory / "source.spm").is_file() and (directory / "target.spm").is_file():
        return directory / "source.spm", directory / "target.spm"
    models = sorted(directory.glob("*.model"))
    if (directory / "sentencepiece.model").is_file():
        models = [directory / "sentencepiece.model"]
    if len(models) != 1:
        raise FileNotFoundError(f"{directory}: no SentencePiece model (source.spm and target.spm, or one "
                                "sentencepiece.model)")
    return models[0], models[0]
