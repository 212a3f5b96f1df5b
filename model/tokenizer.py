"""SentencePiece source/target tokenization and incremental detokenization for streaming."""

from __future__ import annotations

from pathlib import Path

import sentencepiece as spm

REPLACEMENT = "\ufffd"
MARIAN_SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")  # pieces a Marian vocab.json adds around SentencePiece's


class Tokenizer:
    """Source and target SentencePiece models (one file may serve both) mapped onto the model's ids.

    By default a token id is the SentencePiece piece id. A vocabulary list (Marian's vocab.json) may map
    pieces to other ids; then `vocab[i]` is the piece of model id i.
    """

    def __init__(
        self,
        source: spm.SentencePieceProcessor,
        target: spm.SentencePieceProcessor,
        eos_id: int,
        unk_id: int,
        vocab: list[str] | None = None,
    ) -> None:
        self.source, self.target = source, target
        self.eos_id, self.unk_id = eos_id, unk_id
        self.vocab = vocab
        self.piece_to_id = {p: i for i, p in enumerate(vocab)} if vocab is not None else None

    @classmethod
    def load(cls, directory: Path, eos_id: int, unk_id: int, vocab: list[str] | None = None) -> Tokenizer:
        source = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
        target = spm.SentencePieceProcessor(model_file=str(directory / "target.spm"))
        return cls(source, target, eos_id, unk_id, vocab)

    def encode(self, text: str) -> list[int]:
        """Source text -> model ids, ending with end-of-sentence."""
        if self.piece_to_id is None:
            ids: list[int] = self.source.encode(text)
        else:
            code: list[str] = []
            end = text.find("<<") if text.startswith(">>") else -1
            if end >= 0:  # a target-language token such as >>por<< (multilingual Marian models)
                code, text = [text[: end + 2]], text[end + 2 :]
            pieces: list[str] = code + self.source.encode(text, out_type=str)
            ids = [self.piece_to_id.get(p, self.unk_id) for p in pieces]
        return ids + [self.eos_id]

    def pieces(self, ids: list[int]) -> list[str]:
        if self.vocab is not None:
            return [self.vocab[i] for i in ids]
        return [self.target.id_to_piece(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        """Target model ids -> text (special tokens dropped)."""
        if self.vocab is None:
            return str(self.target.decode([i for i in ids if not self._special(i)]))
        return str(self.target.decode_pieces([p for i, p in zip(ids, self.pieces(ids), strict=True)
                                              if not self._special(i)]))

    def _special(self, i: int) -> bool:
        if self.vocab is None:
            return bool(self.target.is_control(i))
        return i in (self.eos_id, self.unk_id) or self.vocab[i] in MARIAN_SPECIAL

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces whose concatenation equals decode(all tokens).

    Like TGI's read offset: the whole sequence is decoded again (sentences are short and SentencePiece decodes
    thousands of pieces per millisecond) and only the text beyond what was already emitted goes out; text that
    ends in a broken character (a partial byte sequence) waits for the next token.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""  # text sent so far

    def push(self, token: int) -> str:
        """Add one token; return the new text it makes certain (possibly empty)."""
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith(REPLACEMENT) or not text.startswith(self.emitted):
            return ""
        new = text[len(self.emitted):]
        self.emitted = text
        return new

    def flush(self) -> str:
        """The rest of the text once the sequence has ended."""
        text = self.tokenizer.decode(self.ids)
        new = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return new
