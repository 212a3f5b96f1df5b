"""Translation quality: sacreBLEU BLEU and chrF of a model on a source/reference pair of files."""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from model import checkpoint
from model.frozen import FrozenTransformer
from model.generation import GenerationConfig
from model.search import generate
from model.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Scores:
    bleu: float
    chrf: float
    sentences: int
    seconds: float
    bleu_signature: str
    chrf_signature: str


def translate_lines(
    net: FrozenTransformer, tokenizer: Tokenizer, lines: list[str], config: GenerationConfig, max_src: int = 256,
    max_rows: int = 64,
) -> list[str]:
    """Translate plain lines (sources longer than max_src tokens are cut) with the offline engine."""
    sources = [tokenizer.encode(line)[:max_src] for line in lines]
    hyps = generate(net, sources, config, max_rows=max_rows)
    return [tokenizer.decode(h[0].tokens) for h in hyps]


def score(hypotheses: list[str], references: list[str], seconds: float = 0.0) -> Scores:
    import sacrebleu  # training/eval extra, not needed by the server

    bleu = sacrebleu.BLEU()
    chrf = sacrebleu.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return Scores(round(b.score, 2), round(c.score, 2), len(hypotheses), round(seconds, 2),
                  str(bleu.get_signature()), str(chrf.get_signature()))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, default=Path("weights/en-pt"), help="model directory")
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus"),
                        help="where --src and --ref are found by default: <split>.<source> and <split>.<target>, "
                             "the languages of the model's info.json")
    parser.add_argument("--split", default="test", help="test | dev | train")
    parser.add_argument("--src", type=Path, default=None, help="source lines (default: from --corpus)")
    parser.add_argument("--ref", type=Path, default=None, help="reference lines (default: from --corpus)")
    parser.add_argument("--beam-size", type=int, default=None, help="default: the model's own default")
    parser.add_argument("--limit", type=int, default=0, help="only the first N lines (0 = all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", choices=checkpoint.PRECISIONS)
    parser.add_argument("--rows", type=int, default=64, help="sequences decoding together")
    parser.add_argument("--output", type=Path, default=None, help="write translations here")
    parser.add_argument("--json", type=Path, default=None, help="write the scores here as JSON")


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    loaded = checkpoint.load(args.model, device=args.device, dtype=args.dtype)
    config = loaded.generation
    if args.beam_size is not None:
        config = config.update(beam_size=args.beam_size, num_hypotheses=1)
    info = loaded.info
    src_path = args.src or args.corpus / f"{args.split}.{info.source_language}"
    ref_path = args.ref or args.corpus / f"{args.split}.{info.target_language}"
    src = src_path.read_text(encoding="utf-8").splitlines()
    ref = ref_path.read_text(encoding="utf-8").splitlines()
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    log.info("%s: %s -> %s, %d sentences", info.name, src_path, ref_path, len(src))
    start = time.perf_counter()
    hyps = translate_lines(loaded.net, loaded.tokenizer, src, config, max_rows=args.rows)
    result = score(hyps, ref, time.perf_counter() - start)
    if args.output:
        args.output.write_text("\n".join(hyps) + "\n", encoding="utf-8")
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
    print(f"BLEU {result.bleu}  chrF {result.chrf}  ({result.sentences} sentences, {result.seconds} s, "
          f"beam {config.beam_size})")
    print(f"  {result.bleu_signature}\n  {result.chrf_signature}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(_parser)
    raise SystemExit(main(_parser.parse_args()))
