"""One text's translation streamed in reading order, as its sentences decode concurrently (`TextStream`)."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING

from model.events import Hypothesis
from model.tokenizer import IncrementalDetokenizer, Tokenizer
from server.placeholders import holds

if TYPE_CHECKING:
    from server.plan import Plan


@dataclass
class Piece:
    text: str
    token: int | None  # None for literal text (whitespace, markup) and tokens replayed after a beam search
    logprob: float | None


class TextStream:
    """Orders one text's streamed pieces: sentences decode concurrently but are emitted in reading order.

    Tokens of a sentence that is not yet the current one wait in a buffer; literal text between sentences is
    prepended to the next emitted piece, or sent alone when the text ends. Beam search sentences emit no tokens
    while decoding, so their best hypothesis is replayed through the detokenizer when they finish. A sentence with
    placeholders is sent whole when it finishes, once they are put back (a mask is never shown); one without is held
    from the first sign that may begin a placeholder (`holds`), since one the model invents is taken out at the end.
    """

    def __init__(self, plan: Plan, text: int, tokenizer: Tokenizer) -> None:
        self.plan = plan
        self.tokenizer = tokenizer
        self.parts = plan.texts[text].parts
        self.html = plan.html
        self.detok: dict[int, IncrementalDetokenizer] = {s: tokenizer.detokenizer() for s in plan.texts[text].sentences}
        self.pushed = dict.fromkeys(self.detok, 0)
        self.buffered: dict[int, list[Piece]] = {s: [] for s in self.detok}
        self.finished: set[int] = set()
        self.signed: set[int] = set()  # sentences held since a sign that may begin a placeholder
        self.sent = dict.fromkeys(self.detok, "")  # each sentence's text sent or buffered so far
        self.spaces = dict.fromkeys(self.detok, "")  # and the spaces after it, held until text follows them
        self.cursor = 0
        self.pending = ""  # literal text passed by the cursor and not sent yet
        self.text = ""  # everything sent so far

    @property
    def done(self) -> bool:
        return self.cursor == len(self.parts)

    def start(self) -> list[Piece]:
        """Literal text before the first sentence (all of it when the text has no sentence)."""
        return self._drain()

    def token(self, sentence: int, token: int, logprob: float | None, source: int | None = None) -> list[Piece]:
        self._push(sentence, token, logprob, source)
        return self._drain()

    def finish(self, sentence: int, best: Hypothesis) -> list[Piece]:
        if self.plan.held(sentence):
            self.pushed[sentence] = len(best.tokens)
            text = self.plan.render(sentence, best, self.tokenizer)
            self.buffered[sentence] = [Piece(text, None, None)] if text else []
            self.finished.add(sentence)
            return self._drain()
        sources = best.alignment
        for k in range(self.pushed[sentence], len(best.tokens)):
            self._push(sentence, best.tokens[k], None, sources[k] if sources is not None else None)
        if sentence in self.signed:  # clean() changes nothing that was sent: the rest follows it
            tail = self.plan.render(sentence, best, self.tokenizer)[len(self.sent[sentence]):]
        else:
            tail = self.spaces[sentence] + self._escaped(self.detok[sentence].flush())
        if tail:
            self.buffered[sentence].append(Piece(tail, None, None))
        self.finished.add(sentence)
        return self._drain()

    def _escaped(self, text: str) -> str:
        return escape(text, quote=False) if self.html else text

    def _push(self, sentence: int, token: int, logprob: float | None, source: int | None) -> None:
        self.pushed[sentence] += 1
        if self.plan.held(sentence):  # held back until finish() puts the placeholders and markup back
            return
        if sentence in self.signed:
            return
        text = self.detok[sentence].push(token, self.plan.unknown(sentence, token, source, self.tokenizer))
        if holds(text):
            self.signed.add(sentence)
            return
        text = self.spaces[sentence] + self._escaped(text)
        shown = text.rstrip(" ")  # spaces before an invented placeholder go with it: they wait for what follows
        self.spaces[sentence] = text[len(shown):]
        if shown:
            self.buffered[sentence].append(Piece(shown, token, logprob))
            self.sent[sentence] += shown

    def _drain(self) -> list[Piece]:
        out: list[Piece] = []
        while self.cursor < len(self.parts):
            part = self.parts[self.cursor]
            if isinstance(part, str):
                self.pending += part
                self.cursor += 1
                continue
            for piece in self.buffered[part]:
                out.append(Piece(self.pending + piece.text, piece.token, piece.logprob))
                self.pending = ""
            self.buffered[part] = []
            if part not in self.finished:
                break
            self.cursor += 1
        if self.done and self.pending:
            out.append(Piece(self.pending, None, None))
            self.pending = ""
        self.text += "".join(p.text for p in out)
        return out
