"""Language detection, offline: py3langid's model (inside its wheel), restricted to the languages the server serves.

py3langid is a naive Bayes classifier over byte n-grams (about 140 languages, 4.6 MB). Restricted to a set of
languages, its scores are a probability over that set alone; a confidence here is that probability times 100. So a
server that translates from one language only detects that one, with confidence 100, whatever the text.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from py3langid.langid import MODEL_FILE, LanguageIdentifier
from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)

# Detection reads a text's beginning only: past this many characters it is no surer, only slower.
MAX_CHARS = 2000
# A served code whose base is not py3langid's name for the language.
ALIASES = {"nb": "no", "iw": "he", "in": "id", "fil": "tl", "zt": "zh", "pb": "pt"}


def base_language(code: str) -> str:
    """py3langid's label for a served code: `pt-BR` -> `pt`, `zh_Hant` -> `zh`, `nb` -> `no`."""
    base = code.replace("_", "-").split("-")[0].lower()
    return ALIASES.get(base, base)


@dataclass(frozen=True)
class Detection:
    language: str  # a served code
    confidence: float  # 0..100: the probability of this language among the served ones


class Detector:
    """py3langid restricted to `languages` (served codes); loading the model takes about a second, so build it once.

    With fewer than two languages the model is never loaded: the one language is certain.
    """

    def __init__(self, languages: Collection[str]) -> None:
        self.languages = sorted(set(languages))
        self._identifier: LanguageIdentifier | None = None
        self._codes: dict[str, list[str]] = {}  # label -> the served codes that share it
        if len(self.languages) < 2:
            return
        identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(identifier.labels)
        for code in self.languages:
            label = base_language(code)
            if label in known:
                self._codes.setdefault(label, []).append(code)
            else:
                log.warning("language detection does not know %r; it is never detected", code)
        if self._codes:
            identifier.set_languages(list(self._codes))
            self._identifier = identifier

    def probabilities(self, text: str) -> dict[str, float]:
        """The probability of each served language for this text (they sum to 1 over the languages it knows)."""
        if self._identifier is None:
            return {code: 1.0 for code in self.languages[:1]}
        # Spaces around the text: the model's n-grams include word boundaries, which a lone word ("Save") lacks
        # (on short UI strings, en/pt: 86-91% right without them, 93-96% with; sentences alike, bench/detect.py).
        scores = dict(self._identifier.rank(f" {text[:MAX_CHARS]} "))
        probs = {code: float(scores[label]) / len(codes) for label, codes in self._codes.items() for code in codes}
        return {code: probs.get(code, 0.0) for code in self.languages}

    def detect(self, text: str, limit: int = 3) -> list[Detection]:
        """The likeliest served languages of one text, best first (at least one; none below 0.1)."""
        return _ranked(self.probabilities(text), limit)

    def detect_all(self, texts: Sequence[str], limit: int = 3) -> list[Detection]:
        """One ranking for several texts, as LibreTranslate answers a list: each language's probability averaged
        over the texts, weighted by their lengths."""
        total: dict[str, float] = dict.fromkeys(self.languages, 0.0)
        weight = 0
        for text in texts:
            n = min(len(text), MAX_CHARS)
            for code, p in self.probabilities(text).items():
                total[code] += n * p
            weight += n
        return _ranked({code: p / max(weight, 1) for code, p in total.items()}, limit)

    def best(self, text: str, among: Sequence[str]) -> Detection:
        """The likeliest of `among` (served codes; the first wins a tie), with its probability among all served."""
        probs = self.probabilities(text)
        code = max(among, key=lambda c: probs.get(c, 0.0))
        return Detection(code, _percent(probs.get(code, 0.0)))


def _percent(p: float) -> float:
    return round(100.0 * p, 1)


def _ranked(probs: dict[str, float], limit: int) -> list[Detection]:
    ranked = sorted(probs.items(), key=lambda item: item[1], reverse=True)[:limit]
    found = [Detection(code, _percent(p)) for code, p in ranked]
    return found[:1] + [d for d in found[1:] if d.confidence > 0]


class LazyDetector:
    """The app's Detector, built on first use, once, in a worker thread (so a server that never detects never
    loads the model, and the event loop never waits for it)."""

    def __init__(self, languages: Collection[str]) -> None:
        self.languages = sorted(set(languages))
        self._detector: Detector | None = None
        self._lock = asyncio.Lock()

    async def get(self) -> Detector:
        if self._detector is None:
            async with self._lock:
                if self._detector is None:
                    self._detector = await run_in_threadpool(Detector, self.languages)
        return self._detector
