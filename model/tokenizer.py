"""SentencePiece source/target tokenization and incremental detokenization for streaming."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import sentencepiece as spm

REPLACEMENT = "\ufffd"
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # SentencePiece's byte fallback
MARIAN_SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")  # pieces a Marian vocab.json adds around SentencePiece's


class Tokenizer:
    """Source and target SentencePiece models (one file may serve both) mapped onto the model's ids.

    By default a token id is the SentencePiece piece id. A vocabulary list (Marian's vocab.json) may map
    pieces to other ids; then `vocab[i]` is the piece of model id i, on both sides unless `source_vocab` gives the
    source's own list (a CTranslate2 model with separate vocabularies). A source ends with end-of-sentence unless
    `add_eos` is false (OpenNMT-py and Argos models), and starts with `bos_id` when `add_bos` is true.
    """

    def __init__(
        self,
        source: spm.SentencePieceProcessor,
        target: spm.SentencePieceProcessor,
        eos_id: int,
        unk_id: int,
        vocab: list[str] | None = None,
        *,
        source_vocab: list[str] | None = None,
        bos_id: int = -1,
        add_bos: bool = False,
        add_eos: bool = True,
    ) -> None:
        self.source, self.target = source, target
        self.eos_id, self.unk_id = eos_id, unk_id
        self.vocab = vocab
        table = source_vocab if source_vocab is not None else vocab
        self.piece_to_id = {p: i for i, p in enumerate(table)} if table is not None else None
        self.source_vocab = source_vocab
        self.add_eos = add_eos
        if add_bos and bos_id < 0:
            raise ValueError("add_bos needs a bos_id")
        self.prefix = [self._source_id(bos_id)] if add_bos else []
        self.source_unk = self._source_id(unk_id)
        self._writes: dict[str, bool] = {}

    @classmethod
    def load(cls, directory: Path, eos_id: int, unk_id: int, vocab: list[str] | None = None,
             **options: Any) -> Tokenizer:
        """The tokenizer of a model directory; `options` are __init__'s keyword arguments."""
        source = spm.SentencePieceProcessor(model_file=str(directory / "source.spm"))
        target = spm.SentencePieceProcessor(model_file=str(directory / "target.spm"))
        return cls(source, target, eos_id, unk_id, vocab, **options)

    def _source_id(self, target_id: int) -> int:
        """The source side's id of a (special) target token: the same id unless the source has its own vocabulary."""
        if self.source_vocab is None or self.piece_to_id is None:
            return target_id
        return self.piece_to_id.get(self.pieces([target_id])[0], target_id)

    def encode(self, text: str) -> list[int]:
        """Source text -> model ids, ending with end-of-sentence unless the model was trained without it.

        A source is never empty: an empty text without end-of-sentence still gets one, since the encoder needs a
        token to attend to.
        """
        if self.piece_to_id is None:
            ids: list[int] = self.source.encode(text)
        else:
            code: list[str] = []
            end = text.find("<<") if text.startswith(">>") else -1
            if end >= 0:  # a target-language token such as >>por<< (multilingual Marian models)
                code, text = [text[: end + 2]], text[end + 2 :]
            pieces: list[str] = code + self.source.encode(text, out_type=str)
            ids = [self.piece_to_id.get(p, self.source_unk) for p in pieces]
        ids = self.prefix + ids
        return ids + [self._source_id(self.eos_id)] if self.add_eos or not ids else ids

    def writes(self, char: str) -> bool:
        """Whether the model reads and writes this character as it is: known pieces on both sides, none unknown or a
        byte of it spelt out, that decode back to it (not changed by normalisation, as ™ is into TM)."""
        known = self._writes.get(char)
        if known is None:
            target = set(self.vocab) if self.vocab is not None else None
            known = self._writes[char] = (_side_writes(self.source, char, self.piece_to_id)
                                          and _side_writes(self.target, char, target))
        return known

    def source_strings(self, text: str) -> list[str]:
        """For each id of `encode(text)`, its piece as SentencePiece cut it from the text, where an unknown character is
        itself rather than <unk>; "" for a start token, end-of-sentence, a >>xxx<< language token, or a byte of a
        character that SentencePiece spelt out byte by byte (a byte alone is no text)."""
        code: list[str] = []
        end = text.find("<<") if self.piece_to_id is not None and text.startswith(">>") else -1
        if end >= 0:
            code, text = [""], text[end + 2 :]
        pieces = ["" if BYTE_PIECE.fullmatch(p) else p for p in self.source.encode(text, out_type=str)]
        out = [""] * len(self.prefix) + code + pieces
        return out + [""] if self.add_eos or not out else out

    def source_pieces(self, ids: list[int]) -> list[str]:
        """Source model ids -> their SentencePiece pieces (a word starts at a piece that starts with U+2581)."""
        table = self.source_vocab if self.source_vocab is not None else self.vocab
        if table is not None:
            return [table[i] for i in ids]
        return [self.source.id_to_piece(i) for i in ids]

    def source_words(self, ids: list[int]) -> list[int]:
        """For each source id, the index of the whitespace-separated word of the text it came from; -1 for tokens
        that are no word's (end-of-sentence, a start token, a multilingual model's >>xxx<< language token)."""
        specials = {*self.prefix, self._source_id(self.eos_id)}
        out, word = [], -1
        for i, piece in zip(ids, self.source_pieces(ids), strict=True):
            if i in specials or piece in MARIAN_SPECIAL or (piece.startswith(">>") and piece.endswith("<<")):
                out.append(-1)
                continue
            if piece.startswith("\u2581") or word < 0:
                word += 1
            out.append(word)
        return out

    def pieces(self, ids: list[int]) -> list[str]:
        if self.vocab is not None:
            return [self.vocab[i] for i in ids]
        return [self.target.id_to_piece(i) for i in ids]

    def decode(self, ids: list[int], unknowns: Mapping[int, str] | None = None) -> str:
        """Target model ids -> text (special tokens dropped). `unknowns`: by position, the source piece that an
        unknown token there is written as (`GenerationConfig.replace_unknowns`); its U+2581 are spaces, as a known
        piece's would be, and the text does not start with one."""
        marked = {k: p for k, p in (unknowns or {}).items() if k < len(ids) and ids[k] == self.unk_id and p}
        if marked:
            return self._decode_replacing(ids, marked)
        if self.vocab is None:
            return str(self.target.decode([i for i in ids if not self._special(i)]))
        return self._spaced(self.target.decode_pieces([p for i, p in zip(ids, self.pieces(ids), strict=True)
                                                       if not self._special(i)]))

    def _spaced(self, text: str) -> str:
        """Text decoded from a vocabulary list, as transformers' MarianTokenizer writes it: a piece that only the
        source's SentencePiece model knows (a name or term copied from the source) passes through decode_pieces as it
        is, so its U+2581 become spaces here, and the ends are stripped."""
        return str(text).replace("\u2581", " ").strip() if self.vocab is not None else str(text)

    def _decode_replacing(self, ids: list[int], marked: dict[int, str]) -> str:
        """`decode` with each marked unknown token first a private-use marker that SentencePiece passes through as it
        is (a piece outside its vocabulary), then that marker replaced by the source piece's text."""
        kept = [f"\ue000{k}\ue001" if k in marked else p
                for k, (i, p) in enumerate(zip(ids, self.pieces(ids), strict=True))
                if k in marked or not self._special(i)]
        text = self._spaced(self.target.decode_pieces(kept))
        for k, piece in marked.items():
            marker, words = f"\ue000{k}\ue001", piece.replace("\u2581", " ")
            if text.startswith(marker) and words.startswith(" "):
                words = words[1:]  # as SentencePiece drops the first piece's leading space
            text = text.replace(marker, words)
        return text

    def _special(self, i: int) -> bool:
        if self.vocab is None:
            return bool(self.target.is_control(i))
        return i in (self.eos_id, self.unk_id) or self.vocab[i] in MARIAN_SPECIAL

    def detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self)


def _side_writes(sp: spm.SentencePieceProcessor, char: str, table: Collection[str] | None) -> bool:
    pieces = sp.encode(char, out_type=str)
    ids = [sp.piece_to_id(p) for p in pieces]
    return (not any(sp.is_unknown(i) or sp.is_byte(i) for i in ids) and sp.decode_pieces(pieces) == char
            and (table is None or all(p in table for p in pieces)))


def source_positions(tokenizer: Tokenizer, text: str, ids: list[int], spans: list[tuple[int, int]]
                     ) -> list[list[int]] | None:
    """For each character span of `text`, the positions in `ids` (`text` as the model reads it) of the tokens of the
    whitespace-separated words it touches; None when the ids' words and the text's do not match up."""
    of_word = tokenizer.source_words(ids)
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
    if max(of_word, default=-1) + 1 != len(words):
        return None
    inside = [{w for w, (x, y) in enumerate(words) if x < b and a < y} for a, b in spans]
    return [[i for i, w in enumerate(of_word) if w in ws] for ws in inside]


class IncrementalDetokenizer:
    """Turns a growing token list into text pieces whose concatenation equals decode(all tokens).

    Like TGI's read offset: the whole sequence is decoded again (sentences are short and SentencePiece decodes
    thousands of pieces per millisecond) and only the text beyond what was already emitted goes out; text that
    ends in a broken character (a partial byte sequence) waits for the next token.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.unknowns: dict[int, str] = {}  # by position, the source pieces unknown tokens are written as
        self.emitted = ""  # text sent so far

    def push(self, token: int, unknown: str | None = None) -> str:
        """Add one token (`unknown`: the source piece it is written as, if it is an unknown token); return the new
        text it makes certain (possibly empty)."""
        if unknown is not None:
            self.unknowns[len(self.ids)] = unknown
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, self.unknowns)
        if text.endswith(REPLACEMENT) or not text.startswith(self.emitted):
            return ""
        new = text[len(self.emitted):]
        self.emitted = text
        return new

    def flush(self) -> str:
        """The rest of the text once the sequence has ended."""
        text = self.tokenizer.decode(self.ids, self.unknowns)
        new = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return new
