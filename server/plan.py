"""A request's texts as sentences to translate, and their translations put back together (whole or streamed).

A `Plan` turns each text into parts (literal strings, or the index of a sentence to translate) and the token ids
of every sentence, so all sentences of all texts of a request go to the scheduler as one job: a long document is
batched with itself. Placeholders and control characters in a sentence are masked before it is tokenized and put
back into its translation (`server/placeholders.py`). `TextStream` turns the job's events, which arrive for many
sentences at once, into pieces of each text in reading order, so that the pieces of a text concatenate to exactly
its non-streamed translation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from html import escape

from model.events import FinishEvent, Hypothesis, TokenEvent
from model.tokenizer import Tokenizer
from server import inline, projection
from server.errors import ShuttingDown
from server.glossaries import Glossary
from server.jobs import Job
from server.masks import Masked, mask, unmask
from server.placeholders import clean, find
from server.stream import Piece, TextStream
from server.text import Part, Sentence, fit, split_html, split_sentences, split_text


@dataclass
class TextPlan:
    parts: list[str | int]  # literal output, or the index of a sentence whose translation goes there
    sentences: list[int] = field(default_factory=list)  # indices of this text's sentences


@dataclass
class Plan:
    texts: list[TextPlan]
    sources: list[list[int]]  # token ids of every sentence, over all texts
    html: bool
    masks: dict[int, Masked] = field(default_factory=dict)  # the sentences that hold placeholders
    # by sentence, a glossary's terms found there: each a list of alternative target-token sequences
    constraints: dict[int, list[list[list[int]]]] = field(default_factory=dict)
    markup: dict[int, projection.Aligned] = field(default_factory=dict)  # sentences that carry inline HTML elements
    where: dict[int, list[list[int]]] = field(default_factory=dict)  # by sentence, its terms' source positions
    # by sentence, its source pieces as cut from the text (Tokenizer.source_strings), kept when generated unknown
    # tokens are to be written as the source piece they attend to most (GenerationConfig.replace_unknowns)
    strings: dict[int, list[str]] = field(default_factory=dict)

    def sentence_constraints(self) -> list[list[list[list[int]]]] | None:
        """Each sentence's constraints for the scheduler, or None when no sentence has any."""
        if not self.constraints:
            return None
        return [self.constraints.get(i, []) for i in range(len(self.sources))]

    def constraint_sources(self) -> list[list[list[int]] | None] | None:
        """Each sentence's terms' source positions for the scheduler (None where not known), or None."""
        if not self.where:
            return None
        return [self.where.get(i) for i in range(len(self.sources))]

    def restore(self, sentence: int, translation: str) -> str:
        """A sentence's translation with its placeholders put back, and none that its source lacks."""
        masked = self.masks.get(sentence)
        return clean(translation, plain=True) if masked is None else unmask(masked, translation)

    def unknown(self, sentence: int, token: int, source: int | None, tokenizer: Tokenizer) -> str | None:
        """The source piece that this token is written as: an unknown token's, where the sentence keeps its pieces."""
        strings = self.strings.get(sentence)
        if strings is None or source is None or token != tokenizer.unk_id or not 0 <= source < len(strings):
            return None
        return strings[source] or None

    def unknowns(self, sentence: int, hyp: Hypothesis, tokenizer: Tokenizer) -> dict[int, str] | None:
        """`unknown` for each token of a hypothesis, by position."""
        if sentence not in self.strings or hyp.alignment is None:
            return None
        found = ((k, self.unknown(sentence, t, a, tokenizer)) for k, (t, a) in enumerate(zip(hyp.tokens, hyp.alignment,
                                                                                             strict=True)))
        return {k: piece for k, piece in found if piece is not None}

    def render(self, sentence: int, hyp: Hypothesis, tokenizer: Tokenizer) -> str:
        """A sentence's output as it goes into its text: placeholders and inline elements back, escaped in HTML."""
        markup = self.markup.get(sentence)
        if markup is not None:
            return projection.render(markup, self.masks.get(sentence), hyp.tokens, hyp.alignment, tokenizer)
        text = self.restore(sentence, tokenizer.decode(hyp.tokens, self.unknowns(sentence, hyp, tokenizer)))
        return escape(text, quote=False) if self.html else text

    def held(self, sentence: int) -> bool:
        """Whether the sentence's text is known only when it is finished (it has placeholders or markup)."""
        return sentence in self.masks or sentence in self.markup

    def input_tokens(self, text: int) -> int:
        return sum(len(self.sources[s]) for s in self.texts[text].sentences)


def make_plan(
    texts: list[str], tokenizer: Tokenizer, html: bool, max_source_tokens: int, placeholders: bool = True,
    prefix: Sequence[int] = (), glossary: Glossary | None = None, unknowns: bool = False,
) -> Plan:
    """Split texts into sentences that each fit the model, mask their placeholders, and tokenize them.

    `prefix`: ids that start every source (a multilingual model's target-language token), counted in its length.
    `glossary`: its terms found in each sentence become the sentence's constraints (target token ids).
    `unknowns`: keep each sentence's source pieces (`Plan.strings`), to write generated unknown tokens with.
    """
    encoded: dict[str, list[int]] = {}

    def opaque(char: str) -> bool:  # a symbol the model would spell byte by byte or lose: carried as a placeholder
        return not tokenizer.writes(char)

    def encode(sentence: str) -> list[int]:
        if sentence not in encoded:
            encoded[sentence] = [*prefix, *tokenizer.encode(sentence)]
        return encoded[sentence]

    def too_long(sentence: str) -> bool:
        return len(encode(sentence)) > max_source_tokens

    plan = Plan([], [], html)

    def add(tp: TextPlan, sentence: str, masked: Masked | None) -> None:
        tp.parts.append(len(plan.sources))
        tp.sentences.append(len(plan.sources))
        if masked is not None:
            plan.masks[len(plan.sources)] = masked
        if glossary is not None:
            terms, where = glossary.placed(sentence, tokenizer, encode(sentence))
            if terms:
                plan.constraints[len(plan.sources)] = terms
            if terms and where is not None:
                plan.where[len(plan.sources)] = where
        if unknowns:
            plan.strings[len(plan.sources)] = [""] * len(prefix) + tokenizer.source_strings(sentence)
        plan.sources.append(encode(sentence))

    def add_block(tp: TextPlan, block: inline.Block) -> bool:
        """A block with inline markup as sentences that carry it; False (nothing added) if one is too long."""
        laid = inline.layout(block, split_sentences)
        masks = {i: mask(p.text, opaque=opaque) for i, p in enumerate(laid) if isinstance(p, inline.Marked)}
        if any(too_long(m.text) for m in masks.values()):
            return False
        for i, p in enumerate(laid):
            if isinstance(p, str):
                tp.parts.append(p)
                continue
            masked = masks[i]
            add(tp, masked.text, None if masked.empty else masked)
            plan.markup[len(plan.sources) - 1] = projection.aligned(
                p, None if masked.empty else masked, plan.sources[-1], tokenizer, block.standins)
        return True

    def add_node(tp: TextPlan, is_text: bool, content: str) -> None:
        """A text node (or a plain text) sentence by sentence; markup as it is."""
        for part in split_text(content) if is_text else [content]:
            if isinstance(part, str):
                tp.parts.append(part)
                continue
            masked = mask(part.text, opaque=opaque) if placeholders else None
            if masked is not None and not masked.empty and not too_long(masked.text):
                add(tp, masked.text, masked)
                continue
            # Too long with placeholders: cut at them (copied as they are), so no cut falls inside one.
            chunks = _cut_at_placeholders(part.text, opaque) if masked is not None and not masked.empty else [part]
            for chunk in chunks:
                for piece in fit(chunk.text, too_long) if isinstance(chunk, Sentence) else [chunk]:
                    if isinstance(piece, str):  # text of the page in HTML: escaped, as translations are
                        tp.parts.append(escape(piece, quote=False) if html else piece)
                    else:
                        add(tp, piece.text, None)

    for text in texts:
        blocks = inline.blocks(split_html(text)) if html else [inline.Block(text, [], {}, [(True, text)])]
        tp = TextPlan([])
        for block in blocks:
            if isinstance(block, str):
                tp.parts.append(block)
            elif not (block.marked and add_block(tp, block)):
                for is_text, content in block.segments:
                    add_node(tp, is_text, content)
        plan.texts.append(tp)
    return plan


def _cut_at_placeholders(sentence: str, opaque: Callable[[str], bool]) -> list[Part]:
    """The sentence as literals (its placeholders, with the spaces around them) and the sentences between them."""
    parts: list[Part] = []
    at = 0
    for p in find(sentence, opaque):
        parts.extend(_words(sentence[at:p.start]))
        parts.append(p.text)
        at = p.start + len(p.text)
    parts.extend(_words(sentence[at:]))
    return parts


def _words(chunk: str) -> list[Part]:
    core = chunk.strip()
    if not any(c.isalnum() for c in core):
        return [chunk] if chunk else []
    head, tail = chunk[: len(chunk) - len(chunk.lstrip())], chunk[len(chunk.rstrip()):]
    return [x for x in (head, Sentence(core), tail) if x]


def join(plan: Plan, text: int, translations: Mapping[int, Hypothesis], tokenizer: Tokenizer) -> str:
    """One text's output: its literals with each sentence replaced by its translation."""
    return "".join(p if isinstance(p, str) else plan.render(p, translations[p], tokenizer)
                   for p in plan.texts[text].parts)


def finish_reason(reasons: list[str]) -> str:
    """A text ended by length if any of its sentences did."""
    return "length" if "length" in reasons else "eos"


@dataclass
class TextResult:
    text: str
    alternatives: list[str]
    finish_reason: str
    input_tokens: int
    generated_tokens: int
    scores: list[float]  # best hypothesis of each sentence
    models: list[str] = field(default_factory=list)  # that translated it, in order (two through English)


@dataclass
class PieceEvent:
    index: int  # which text
    piece: Piece


@dataclass
class TextDone:
    index: int
    result: TextResult


class Translation:
    """A planned request and its scheduler job: wait for the results, or stream them text by text."""

    def __init__(self, plan: Plan, job: Job | None, tokenizer: Tokenizer, alternatives: int = 0,
                 model: str = "") -> None:
        self.plan = plan
        self.models = [model] if model else []
        self.load_s = 0.0  # how long the request waited for its model to load (on demand)
        self.job = job  # None when there is no sentence at all (HTML made only of markup)
        self.tokenizer = tokenizer
        self.alternatives = alternatives

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    async def results(self) -> list[TextResult]:
        finished = await self.job.results() if self.job is not None else []
        by_index = {f.sentence: f for f in finished}
        return [self._result(t, by_index) for t in range(len(self.plan.texts))]

    async def stream(self) -> AsyncIterator[PieceEvent | TextDone]:
        """Pieces of text in reading order for each text, and a TextDone when a text is complete."""
        streams = [TextStream(self.plan, t, self.tokenizer) for t in range(len(self.plan.texts))]
        owner = {s: t for t, tp in enumerate(self.plan.texts) for s in tp.sentences}
        finished: dict[int, FinishEvent] = {}
        for t, ts in enumerate(streams):
            for piece in ts.start():
                yield PieceEvent(t, piece)
            if ts.done:
                yield TextDone(t, self._result(t, finished, ts.text))
        if self.job is None:
            return
        try:
            async for event in self.job.events():
                t = owner[event.sentence]
                ts = streams[t]
                if isinstance(event, TokenEvent):
                    pieces = ts.token(event.sentence, event.token, event.logprob, event.source)
                else:
                    finished[event.sentence] = event
                    pieces = ts.finish(event.sentence, event.hypotheses[0])
                for piece in pieces:
                    yield PieceEvent(t, piece)
                if isinstance(event, FinishEvent) and ts.done:
                    yield TextDone(t, self._result(t, finished, ts.text))
        except ShuttingDown:  # what was sent stands; the texts end as "cancelled"
            for t, ts in enumerate(streams):
                if not ts.done:
                    sentences = self.plan.texts[t].sentences
                    yield TextDone(t, TextResult(ts.text, [], "cancelled", self.plan.input_tokens(t),
                                                 sum(ts.pushed[s] for s in sentences), [], self.models))

    def _result(self, t: int, finished: Mapping[int, FinishEvent], text: str | None = None) -> TextResult:
        sentences = self.plan.texts[t].sentences
        nbest = {s: finished[s].hypotheses for s in sentences}
        if text is None:  # a stream passes the text it sent
            text = join(self.plan, t, {s: h[0] for s, h in nbest.items()}, self.tokenizer)
        alternatives: list[str] = []  # distinct, and not the translation itself: fewer when the beam has no more
        for j in range(1, max((len(h) for h in nbest.values()), default=1)):
            other = join(self.plan, t, {s: h[min(j, len(h) - 1)] for s, h in nbest.items()}, self.tokenizer)
            if len(alternatives) < self.alternatives and other != text and other not in alternatives:
                alternatives.append(other)
        return TextResult(
            text=text,
            alternatives=alternatives,
            finish_reason=finish_reason([finished[s].finish_reason for s in sentences]),
            input_tokens=self.plan.input_tokens(t),
            generated_tokens=sum(len(h[0].tokens) for h in nbest.values()),
            scores=[h[0].score for h in nbest.values()],
            models=self.models,
        )
