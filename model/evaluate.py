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
    net: FrozenTransformer, tokenizer: Tokenizer, lines: list[str], config: GenerationConfig, max_src: int = 256
) -> list[str]:
    """Translate plain lines (sources longer than max_src tokens are cut) with the offline engine."""
    sources = [tokenizer.encode(line)[:max_src] for line in lines]
    hyps = generate(net, sources, config)
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
    parser.add_argument("--src", type=Path, default=Path("data/corpus/test.en"), help="source lines")
    parser.add_argument("--ref", type=Path, default=Path("data/corpus/test.pt"), help="reference lines")
    parser.add_argument("--beam-size", type=int, default=None, help="default: the model's own default")
    parser.add_argument("--limit", type=int, default=0, help="only the first N lines (0 = all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--output", type=Path, default=None, help="write translations here")
    parser.add_argument("--json", type=Path, default=None, help="write the scores here as JSON")


def main(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    loaded = checkpoint.load(args.model, device=args.device)
    config = loaded.generation
    if args.beam_size is not None:
        config = config.update(beam_size=args.beam_size, num_hypotheses=1)
    src = args.src.read_text(encoding="utf-8").splitlines()
    ref = args.ref.read_text(encoding="utf-8").splitlines()
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    start = time.perf_counter()
    hyps = translate_lines(loaded.net, loaded.tokenizer, src, config)
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
