"""Text normalisation and pair filters.

The functions here are pure (no I/O) so they are easy to unit test:

* :func:`normalize` - markup/accelerator stripping and whitespace collapsing;
* :func:`placeholders` / :func:`placeholders_match` - printf, Python, Qt and
  brace placeholders must agree between source and target;
* :func:`reject_reason` - length, ratio, junk and language sanity filters.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections import Counter

MIN_TOKENS = 1
MAX_TOKENS = 250
MAX_RATIO = 3.0

_TAG = re.compile(r"</?[A-Za-z][\w:.-]*(?:\s+[^<>]*?)?/?>")
_ACCEL_UNDERSCORE = re.compile(r"(?<![\w_])_(?=\w)")
_ACCEL_AMP = re.compile(
    r"(?:(?<![\w&])&(?=[^\W\d_])|(?<=[^\W\d_])&(?=[a-z\u00e0-\u00ff]))(?![A-Za-z]+;|#\d+;|#x[0-9a-fA-F]+;)"
)
_ACCEL_UNDERSCORE_MID = re.compile(r"(?<=[^\W\d_])_(?=[^\W\d_])")
_ACCEL_TILDE = re.compile(r"~(?=\w)")
_ACCEL_PAREN = re.compile(r"\s*\((?:_|&)[A-Za-z]\)")
_WS = re.compile(r"\s+")

_PRINTF = re.compile(
    r"%(?:(\d+)\$)?[-+#0]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t|I64|I32)?"
    r"([diouxXeEfFgGaAcspn])"
)
_PY_NAMED = re.compile(r"%\((\w+)\)[-+#0 ]*\d*(?:\.\d+)?[diouxXeEfFgGcrs]")
_QT = re.compile(r"%L?(\d{1,2})(?!\d)")
_BRACE = re.compile(r"\{\s*\$?[\w.-]*\s*(?::[^{}]*)?\}")
_DOLLAR = re.compile(r"\$\{?\w+\}?|\$\(\w+\)")

_LETTER_CATS = ("Lu", "Ll", "Lt", "Lm", "Lo")
_FOREIGN_SCRIPTS = re.compile(r"[\u0400-\u04ff\u0590-\u06ff\u0e00-\u0e7f\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]")
_KEY_LIKE = re.compile(r"^[\w.:/-]*(?:[A-Za-z0-9]_[A-Za-z0-9]|[a-z]\.[a-z]|[a-z][A-Z])[\w.:/-]*$")
_URL_ONLY = re.compile(r"^(?:https?://|www\.|[\w.+-]+@[\w.-]+$|/[\w./-]+$)")


def strip_markup(text: str) -> str:
    """Remove XML/HTML tags and unescape entities."""
    return html.unescape(_TAG.sub("", text))


def strip_accelerators(text: str) -> str:
    """Remove keyboard accelerator markers: ``_File``, ``&File``, ``~File``, ``(_F)``."""
    text = _ACCEL_PAREN.sub("", text)
    text = _ACCEL_UNDERSCORE.sub("", text)
    if text.count("_") == 1:
        text = _ACCEL_UNDERSCORE_MID.sub("", text)
    text = _ACCEL_AMP.sub("", text)
    text = _ACCEL_TILDE.sub("", text)
    return text.replace("&&", "&")


def collapse_ws(text: str) -> str:
    """Collapse all whitespace (tabs, newlines) to single spaces and trim."""
    return _WS.sub(" ", text).strip()


def normalize(text: str, markup: bool = True, accelerators: bool = True) -> str:
    """Full normalisation of one UI or document string."""
    text = unicodedata.normalize("NFC", text)
    text = text.replace("\u00ad", "").replace("\u200b", "")
    if accelerators:
        text = strip_accelerators(text)
    if markup:
        text = strip_markup(text)
    text = "".join(ch if ch.isprintable() or ch.isspace() else " " for ch in text)
    return collapse_ws(text)


def placeholders(text: str) -> Counter[str]:
    """Multiset of placeholders in ``text`` (positions are ignored)."""
    found: Counter[str] = Counter()
    rest = text.replace("%%", " ")
    for pattern, key in ((_BRACE, _brace_key), (_PY_NAMED, _named_key),
                         (_PRINTF, _printf_key), (_QT, _qt_key), (_DOLLAR, _plain_key)):
        for match in pattern.finditer(rest):
            found[key(match)] += 1
        rest = pattern.sub(" ", rest)
    return found


def _brace_key(match: re.Match[str]) -> str:
    return re.sub(r"\s+", "", match.group(0))


def _named_key(match: re.Match[str]) -> str:
    return "%(" + match.group(1) + ")"


def _printf_key(match: re.Match[str]) -> str:
    conv = match.group(2)
    return "%" + ("s" if conv in "sS" else conv)


def _qt_key(match: re.Match[str]) -> str:
    return "%" + match.group(1)


def _plain_key(match: re.Match[str]) -> str:
    return match.group(0)


def placeholders_match(source: str, target: str) -> bool:
    """True when both sides carry the same placeholders (ignoring order)."""
    return placeholders(source) == placeholders(target)


def tokens(text: str) -> int:
    """Whitespace token count."""
    return len(text.split())


def letter_fraction(text: str) -> float:
    """Fraction of non-space characters that are letters."""
    chars = [ch for ch in text if not ch.isspace()]
    if not chars:
        return 0.0
    letters = sum(1 for ch in chars if unicodedata.category(ch) in _LETTER_CATS)
    return letters / len(chars)


def length_ratio_ok(source: str, target: str, max_ratio: float = MAX_RATIO) -> bool:
    """Character length ratio check, smoothed so very short strings pass."""
    a, b = len(source) + 6, len(target) + 6
    return max(a, b) / min(a, b) <= max_ratio


def _word_key(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text.lower()).strip()


def looks_untranslated(source: str, target: str) -> bool:
    """True when the target is (nearly) a copy of the source."""
    src, tgt = _word_key(source), _word_key(target)
    if src == tgt:
        return True
    src_words, tgt_words = src.split(), tgt.split()
    if len(src_words) < 4 or not tgt_words:
        return False
    vocab = set(src_words)
    shared = sum(1 for w in tgt_words if w in vocab)
    return shared / len(tgt_words) > 0.8 and not _has_portuguese_marks(target, source)


def _has_portuguese_marks(target: str, source: str) -> bool:
    marks = set("ãõçáéíóúâêôà")
    return bool((set(target.lower()) & marks) - set(source.lower()))


def reject_reason(source: str, target: str,
                  min_tokens: int = MIN_TOKENS, max_tokens: int = MAX_TOKENS) -> str | None:
    """Return why a (normalised) pair is rejected, or ``None`` to keep it."""
    if not source or not target:
        return "empty"
    ns, nt = tokens(source), tokens(target)
    if not (min_tokens <= ns <= max_tokens and min_tokens <= nt <= max_tokens):
        return "length"
    if not length_ratio_ok(source, target):
        return "ratio"
    if letter_fraction(source) < 0.5 or letter_fraction(target) < 0.5:
        return "junk"
    if _URL_ONLY.match(source) or "\ufffd" in source + target:
        return "junk"
    if _KEY_LIKE.match(source):
        return "key"
    if _FOREIGN_SCRIPTS.search(target) and not _FOREIGN_SCRIPTS.search(source):
        return "script"
    if looks_untranslated(source, target):
        return "identical"
    if not placeholders_match(source, target):
        return "placeholders"
    return None
