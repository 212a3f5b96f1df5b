"""Can Tolk give CTranslate2 int8's sentences? Its int8 arithmetic, emulated product by product, against the real thing.

CTranslate2's int8 products (`Dense` with int8 weights, `src/layers/common.cc`, `src/cpu/kernels.cc`): weights
quantized per output channel by the converter (scale 127 / amax, `np.rint`); each input row quantized with its own
scale 127 / amax and rounded; on x86 the row is shifted to uint8 (+128) for a u8 x s8 GEMM whose shift is undone by a
precomputed compensation; the int32 sums are dequantized as sum * (1 / row scale) / weight scale + bias. Embeddings
are int8 too and looked up as q / scale. On a CPU without VNNI the GEMM multiplies with AVX2's `vpmaddubsw`, which
adds the products of neighbouring k in pairs and saturates each pair to int16 (255 * 127 * 2 > 32767), so the sums
are not exact; with VNNI they are.

This script converts a Tolk model with CTranslate2 int8 weights (bench/ct2_convert.py), translates sentences with
`ctranslate2.Translator(compute_type="int8")`, and with Tolk's operator-by-operator network whose every product is
replaced by one of these emulations (greedy, one sentence at a time, one thread), then counts identical sentences:

- `dequantized`: the int8 weights as float32, float arithmetic (what `tolk import` serves today);
- `exact`: per-row int8 activations, exact integer sums;
- `saturated`: the same with each pair of neighbouring products saturated to int16 (AVX2 without VNNI).

Then what the server runs for a model without int8.json, int8 with a scale per row (`checkpoint.load(...,
int8="rows")`, `model.projection.Rows8`: 7 bits per row, exact sums, fused step and encoder included), on the model and
on the CTranslate2 int8 file brought back by `tolk import`'s code.

CTranslate2 float32 on the same file is the reference for how far int8 moves a sentence. Prints a table and writes
JSON. Never run by the test suite.

    python bench/ct2_int8_parity.py [--model weights/en-pt] [--sentences data/corpus/test.en] [-n 200]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ct2_convert import TolkConverter, banned_pieces  # noqa: E402

from model.checkpoint import ModelInfo, load  # noqa: E402
from model.ct2_import import import_ct2  # noqa: E402
from model.frozen import FrozenTransformer  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from model.marian_format import spm_pieces  # noqa: E402
from model.projection import Projection  # noqa: E402
from model.search import generate  # noqa: E402

MODES = ("dequantized", "exact", "saturated")


def quantize_rows(w: Tensor) -> tuple[Tensor, Tensor]:
    """CTranslate2's converter: per row, scale 127 / amax (1 where amax is 0) and rint(w * scale)."""
    amax = w.abs().amax(1)
    scale = torch.where(amax != 0, 127.0 / amax, torch.ones_like(amax))
    return torch.round(w * scale[:, None]), scale


class EmulatedProjection(Projection):
    """A Projection whose product is CTranslate2's int8 product in one of MODES (set by `emulate`)."""

    mode: str
    q: Tensor  # (N, K) the int8 weight, as float64
    qi: Tensor  # the same as int32
    q_sum: Tensor  # (N,) its row sums: the uint8 shift's compensation
    w_scale: Tensor  # (N,)

    def __call__(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1]).float()
        if self.mode == "dequantized":
            y = flat @ (self.q / self.w_scale[:, None].double()).float().t()
        else:
            amax = flat.abs().amax(1)
            a_scale = torch.where(amax != 0, 127.0 / amax, torch.ones_like(amax))
            shifted = torch.round(flat * a_scale[:, None] + 128.0)  # uint8, 1..255
            if self.mode == "exact":
                sums = ((shifted - 128.0).double() @ self.q.t()).float()
            else:
                sums = torch.stack([self._saturated(row) for row in shifted.to(torch.int32)]).float()
            y = (sums * (1.0 / a_scale)[:, None]) / self.w_scale[None, :]
        if self.bias is not None:
            y = y + self.bias
        y = y.view(*shape[:-1], -1)
        y = self.act(y) if self.act is not None else y
        return y if residual is None else y + residual

    def _saturated(self, u8: Tensor) -> Tensor:
        """One uint8 row's sums with `vpmaddubsw`'s int16 saturation of each pair of neighbouring products."""
        products = u8[None, :] * self.qi  # (N, K)
        pairs = products.view(self.qi.shape[0], -1, 2).sum(-1).clamp(-32768, 32767)
        return pairs.sum(-1) - 128 * self.q_sum


def emulating(directory: Path, mode: str) -> FrozenTransformer:
    """Tolk's network of the model with int8 embeddings and every product emulating CTranslate2's int8 in `mode`."""
    loaded = load(directory, device="cpu", dtype="float32", keep_modules=True)
    net = FrozenTransformer(loaded.model, prepack=False, fused=False)
    for projection in net.projections().values():
        q, scale = quantize_rows(projection.weight.float())  # type: ignore[union-attr]
        projection.__class__ = EmulatedProjection
        p = cast(EmulatedProjection, projection)
        p.mode, p.q, p.qi, p.q_sum, p.w_scale = mode, q.double(), q.to(torch.int32), q.to(torch.int32).sum(1), scale
    for name in ("src_table", "tgt_table"):  # an int8 table is looked up as q / scale
        q, scale = quantize_rows(getattr(net, name))
        setattr(net, name, q / scale[:, None])
    return net


def vnni() -> bool:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    return "avx512_vnni" in flags or "avx_vnni" in flags


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=ROOT / "weights" / "en-pt")
    p.add_argument("--sentences", type=Path, default=ROOT / "data" / "corpus" / "test.en")
    p.add_argument("-n", type=int, default=200)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "ct2-int8-parity.json")
    args = p.parse_args()

    import ctranslate2

    torch.set_num_threads(1)
    work = Path(tempfile.mkdtemp(prefix="tolk-ct2-int8-"))
    TolkConverter(args.model).convert(str(work), quantization="int8", force=True)
    tokenizer = load(args.model, device="cpu", dtype="float32").tokenizer
    source_pieces = tokenizer.vocab or spm_pieces(args.model / "source.spm")
    target_pieces = tokenizer.vocab or spm_pieces(args.model / "target.spm")
    suppress = [[piece] for piece in banned_pieces(args.model)] or None
    texts = [line.strip() for line in args.sentences.open(encoding="utf-8")][: args.n]
    sources = [tokenizer.encode(t) for t in texts]

    def ct2(compute_type: str) -> list[list[str]]:
        translator = ctranslate2.Translator(str(work), device="cpu", compute_type=compute_type, intra_threads=1)
        return [translator.translate_batch([[source_pieces[i] for i in ids]], beam_size=1, max_decoding_length=256,
                                           suppress_sequences=suppress)[0].hypotheses[0] for ids in sources]

    reference = ct2("int8")
    rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    rows.append({"system": "CTranslate2 float32, same file", "same": sum(
        a == b for a, b in zip(ct2("float32"), reference, strict=True))})
    config = GenerationConfig(max_new_tokens=256, scores=False)
    for mode in MODES:
        net = emulating(args.model, mode)
        with torch.inference_mode():
            out = [[target_pieces[i] for i in generate(net, [ids], config)[0][0].tokens] for ids in sources]
        rows.append({"system": f"Tolk, {mode}", "same": sum(a == b for a, b in zip(out, reference, strict=True))})
    # What the server runs: int8 with a scale per row (model.projection.Rows8), the fused step and encoder, on the
    # model itself and on the CTranslate2 int8 file imported by `tolk import`
    imported = import_ct2(work, work / "imported", ModelInfo("imported", "und", "und"),
                          spms=(args.model / "source.spm", args.model / "target.spm"))
    for system, directory in (("Tolk int8 per row, the model", args.model),
                              ("Tolk int8 per row, the int8 file imported", imported)):
        lm = load(directory, device="cpu", dtype="int8", int8="rows")
        pieces = lm.tokenizer.vocab or spm_pieces(directory / "target.spm")
        assert pieces == target_pieces  # the import keeps the ids; CTranslate2's file has no add_source_eos, so
        with torch.inference_mode():   # both models take the very pieces CTranslate2 was given, </s> included
            out = [[pieces[i] for i in generate(lm.net, [ids], config)[0][0].tokens] for ids in sources]
        rows.append({"system": system, "same": sum(a == b for a, b in zip(out, reference, strict=True))})
    print(f"\nSentences identical to CTranslate2 {ctranslate2.__version__} int8 ({len(texts)} sentences of "
          f"{args.sentences.name}, greedy; CPU {'with' if vnni() else 'without'} VNNI)\n")
    print("| system | same sentences |\n|---|---:|")
    for r in rows:
        r["percent"] = round(100 * r["same"] / len(texts), 1)
        print(f"| {r['system']} | {r['same']} ({r['percent']}%) |")
    result = {"model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
              "sentences": len(texts), "ctranslate2": ctranslate2.__version__, "torch": torch.__version__,
              "cpu": platform.processor() or platform.machine(), "vnni": vnni(), "rows": rows,
              "seconds": round(time.perf_counter() - start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
