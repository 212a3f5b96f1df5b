"""Language detection, offline: py3langid's model (inside its wheel) over every language it knows.

py3langid is a naive Bayes classifier over byte n-grams (97 languages, 4.6 MB). Its probabilities assume every
language equally likely; here the languages the server serves (from or into) are taken as `PRIOR` times likelier
than the others, since a server's users mostly send those: a short string ("Save") stays English or Portuguese as
it is, and a sentence in a language the server does not serve is detected as that language, not forced onto a
served one. A confidence is that probability times 100.
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
# A served language is this many times likelier than another: short UI strings in the served languages are detected
# as well as when detection was restricted to them, and sentences in others as themselves (docs/benchmarks.md,
# "Language detection over every language").
PRIOR = 20.0
NO_LANGUAGE = "zxx"  # py3langid's label for a text without linguistic content (numbers, codes)
# A served code whose base is not py3langid's name for the language.
ALIASES = {"nb": "no", "iw": "he", "in": "id", "fil": "tl", "zt": "zh", "pb": "pt"}


def base_language(code: str) -> str:
    """py3langid's label for a served code: `pt-BR` -> `pt`, `zh_Hant` -> `zh`, `nb` -> `no`."""
    base = code.replace("_", "-").split("-")[0].lower()
    return ALIASES.get(base, base)


@dataclass(frozen=True)
class Detection:
    language: str  # a served code, or the detector's code for a language the server does not serve
    confidence: float  # 0..100: the probability of this language


class Detector:
    """py3langid over all its languages, `languages` (served codes) PRIOR times likelier; loading takes about a
    second, so build it once."""

    def __init__(self, languages: Collection[str], prior: float = PRIOR) -> None:
        self.languages = sorted(set(languages))
        self.prior = prior
        self._identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
        known = set(self._identifier.labels)
        self._codes: dict[str, str] = {}  # label -> the served code it is answered as
        for code in self.languages:
            label = base_language(code)
            if label in known:
                self._codes.setdefault(label, code)
            else:
                log.warning("language detection does not know %r; it is never detected", code)

    def probabilities(self, text: str) -> dict[str, float]:
        """The probability of each language for this text, by served code (or the detector's own code)."""
        # Spaces around the text: the model's n-grams include word boundaries, which a lone word ("Save") lacks
        # (docs/benchmarks.md, "Language detection").
        ranked = self._identifier.rank(f" {text[:MAX_CHARS]} ")
        weighted = {label: float(p) * (self.prior if label in self._codes else 1.0) for label, p in ranked}
        if max(weighted, key=weighted.__getitem__) == NO_LANGUAGE and self._codes:
            # no words to tell a language by ("12345", "v2.0"): the likeliest of the served ones, not a refusal
            weighted = {label: p for label, p in weighted.items() if label in self._codes}
        weighted.pop(NO_LANGUAGE, None)
        total = sum(weighted.values()) or 1.0
        return {self._codes.get(label, label): p / total for label, p in weighted.items()}

    def detect(self, text: str, limit: int = 3) -> list[Detection]:
        """The likeliest languages of one text, best first (at least one; none below 0.1)."""
        return _ranked(self.probabilities(text), limit)

    def detect_all(self, texts: Sequence[str], limit: int = 3) -> list[Detection]:
        """One ranking for several texts, as LibreTranslate answers a list: each language's probability averaged
        over the texts, weighted by their lengths."""
        total: dict[str, float] = {}
        weight = 0
        for text in texts:
            n = min(len(text), MAX_CHARS)
            for code, p in self.probabilities(text).items():
                total[code] = total.get(code, 0.0) + n * p
            weight += n
        return _ranked({code: p / max(weight, 1) for code, p in total.items()}, limit)

    def best(self, text: str) -> Detection:
        """The likeliest language of a text."""
        return self.detect(text, limit=1)[0]


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
