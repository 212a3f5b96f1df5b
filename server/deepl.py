"""DeepL's API shapes on Tolk's: language codes, the fields of a request (JSON or form), tags, and the error body.

DeepL writes languages in upper case and wants a region for English and Portuguese targets (`EN-US`, `PT-BR`; its
SDKs refuse a bare `EN` or `PT` themselves); Tolk matches any of them to the served languages
(`server/languages.py`). `tag_handling` xml and html go through Tolk's HTML path (`server/inline.py`): what DeepL's
tag options ask is written into the markup that path knows before the translation, and undone after
(`TagOptions`): an element of `ignore_tags` becomes an empty `<code>` (copied as a placeholder, as Weblate's
`<x id="1"></x>` must be), one of `non_splitting_tags` a `<span>` (inline, put back around the words it covers), one
of `splitting_tags` a `<div>` (a block of its own).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl

from fastapi import Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from server.deps import parse_multipart, read_body
from server.errors import InvalidEncoding, InvalidJSON, TolkError, ValidationFailed, from_validation
from server.languages import standard
from server.routes.info import NAMES
from server.schemas import error_responses
from server.settings import Settings

# DeepL's targets for these languages name a region; the bare code is taken too, but its SDKs refuse to send it
REGIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "en": (("EN-GB", "English (British)"), ("EN-US", "English (American)")),
    "pt": (("PT-BR", "Portuguese (Brazilian)"), ("PT-PT", "Portuguese (European)")),
}
LIST_FIELDS = frozenset(("text", "ignore_tags", "non_splitting_tags", "splitting_tags", "glossary_ids",
                         "custom_instructions"))


def deepl_code(code: str) -> str:
    """A language as DeepL writes it: `pt-BR` -> `PT-BR`, `en` -> `EN`."""
    return standard(code).upper()


def language_name(code: str) -> str:
    base = standard(code).split("-")[0].lower()
    return NAMES.get(base, code)


def target_codes(code: str) -> list[tuple[str, str]]:
    """DeepL's codes (and names) of a served target language: a region for English and Portuguese, as DeepL has."""
    return list(REGIONS.get(code, ((deepl_code(code), language_name(code)),)))


class DeepLError(BaseModel):
    """DeepL's error body: its SDKs read `message`; `code` is Tolk's `error_type`."""

    message: str
    code: str


def deepl_error(error: TolkError, status: int) -> dict[str, Any]:
    return DeepLError(message=error.message, code=error.error_type).model_dump()


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI's `requestBody` of a route that reads its body itself (the model is among the app's components)."""
    return {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
            "required": True}


def deepl_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` of a DeepL route's errors."""
    return error_responses(*codes, body=DeepLError)


def _tags(value: Any) -> Any:
    """Tag lists as DeepL takes them: a list, a comma-separated string, or a list of comma-separated strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        return value
    return [tag.strip() for item in items for tag in str(item).split(",") if tag.strip()]


def _texts(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def _flag(value: Any) -> Any:
    """DeepL's 0/1 settings come as numbers in JSON and strings in forms."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


Tags = Annotated[list[str], BeforeValidator(_tags)]


class DeepLTranslate(BaseModel):
    """The fields of DeepL's POST /v2/translate. Those Tolk's models cannot act on are taken and have no effect
    (`context`, `formality`, `split_sentences`, `preserve_formatting`, `outline_detection`; docs/integrations.md);
    unknown fields are ignored, as DeepL ignores them."""

    model_config = ConfigDict(extra="ignore")

    text: Annotated[list[str], BeforeValidator(_texts)] = Field(min_length=1)
    source_lang: str | None = None
    target_lang: str
    context: str | None = None
    show_billed_characters: bool = False
    split_sentences: Annotated[Literal["0", "1", "nonewlines"], BeforeValidator(_flag)] | None = None
    preserve_formatting: bool | None = None
    formality: Literal["default", "more", "less", "prefer_more", "prefer_less"] | None = None
    model_type: Literal["quality_optimized", "prefer_quality_optimized", "latency_optimized"] | None = None
    glossary_id: str | None = None
    glossary_ids: list[str] = Field(default_factory=list, max_length=5)
    tag_handling: Literal["xml", "html"] | None = None
    tag_handling_version: Literal["v1", "v2"] | None = None
    outline_detection: bool | None = None
    ignore_tags: Tags = Field(default_factory=list)
    non_splitting_tags: Tags = Field(default_factory=list)
    splitting_tags: Tags = Field(default_factory=list)
    auth_key: str | None = Field(default=None, description="DeepL's former way of sending the key, in the body")


def fields(pairs: list[tuple[str, str]], lists: frozenset[str] = LIST_FIELDS) -> dict[str, Any]:
    """Form or query fields as DeepL reads them: `text` (and the tag lists) repeated make a list."""
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in lists:
            data.setdefault(key, []).append(value)
        else:
            data[key] = value
    return data


async def deepl_body(request: Request, settings: Settings, lists: frozenset[str] = LIST_FIELDS) -> dict[str, Any]:
    """A DeepL request's fields: a JSON object or a form (urlencoded or multipart), and its query string's fields
    (the body's win). A GET's body is read as well: DeepL's SDKs send `type=target` as a form on a GET.
    `lists`: the form fields that make a list when repeated (DeepL's `text`; the plugins' shapes name theirs)."""
    query = fields(parse_qsl(request.url.query, keep_blank_values=True), lists)
    body = await read_body(request, settings.max_body_bytes)
    content_type = request.headers.get("content-type", "")
    if not body.strip():
        return query
    if content_type.startswith("multipart/form-data"):
        form = await parse_multipart(request, body)
        try:
            return {**query, **fields([(k, v) for k, v in form.multi_items() if isinstance(v, str)], lists)}
        finally:
            await form.close()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidEncoding(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    if content_type.startswith("application/x-www-form-urlencoded"):
        return {**query, **fields(parse_qsl(text, keep_blank_values=True), lists)}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InvalidJSON("request body is not valid JSON") from exc
    if not isinstance(data, dict):
        raise ValidationFailed("request body must be a JSON object")
    return {**query, **data}


def validated(model: type[BaseModel], data: dict[str, Any]) -> Any:
    """`data` as `model`, 422 naming the field otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc) from exc


@dataclass
class TagOptions:
    """DeepL's tag options written into one text as markup of Tolk's HTML path, and undone in its translation."""

    ignore: list[str]
    inline: list[str]  # non_splitting_tags
    block: list[str]  # splitting_tags
    kept: dict[str, str] = field(default_factory=dict)  # stand-in -> the element it stands for
    renamed: dict[str, str] = field(default_factory=dict)  # marker -> the tag's name

    def prepare(self, text: str) -> str:
        """The text with ignored elements as placeholders and the listed tags renamed."""
        nonce = hashlib.sha256(text.encode()).hexdigest()[:8]  # no stand-in can be mistaken for the text's own

        def keep(m: re.Match[str]) -> str:
            stand_in = f'<code data-tolk-keep="{nonce}-{len(self.kept)}"></code>'
            self.kept[stand_in] = m.group()
            return stand_in

        for name in self.ignore:
            text = _element(name).sub(keep, text)
        for names, to in ((self.inline, "span"), (self.block, "div")):
            for name in names:
                text = _tag(name).sub(partial(self._rename, to=to, nonce=nonce), text)
        return text

    def _rename(self, m: re.Match[str], to: str, nonce: str) -> str:
        if m.group(1):
            return f"</{to}>"
        marker = f"{nonce}-{len(self.renamed)}"
        self.renamed[marker] = m.group()
        return f'<{to} data-tolk-tag="{marker}">' + (f"</{to}>" if m.group().endswith("/>") else "")

    def restore(self, text: str) -> str:
        """The translation with the original elements and tags back."""
        for stand_in, original in self.kept.items():
            text = text.replace(stand_in, original)
        if self.renamed:
            text = _unrename(text, self.renamed)
        return text


def _element(name: str) -> re.Pattern[str]:
    n = re.escape(name)
    return re.compile(rf"<{n}(?:\s[^<>]*?)?/>|<{n}(?:\s[^<>]*)?>.*?</{n}\s*>", re.DOTALL)


def _tag(name: str) -> re.Pattern[str]:
    return re.compile(rf"<(/?){re.escape(name)}(?:\s[^<>]*?)?/?>")


_RENAMED = re.compile(r'<(span|div)(?:\s[^<>]*?)?>|</(span|div)\s*>')
_MARKER = re.compile(r'data-tolk-tag="([^"]+)"')


def _unrename(text: str, renamed: dict[str, str]) -> str:
    """Put the original tags back for the renamed spans and divs, closing each as it was opened."""
    stacks: dict[str, list[str | None]] = {"span": [], "div": []}

    def back(m: re.Match[str]) -> str:
        if m.group(1):  # an opening tag: ours (with its marker) or the text's own
            marker = _MARKER.search(m.group())
            original = renamed.get(marker.group(1)) if marker else None
            stacks[m.group(1)].append(original)
            return original or m.group()
        stack = stacks[m.group(2)]
        original = stack.pop() if stack else None
        if original is None:
            return m.group()
        if original.endswith("/>"):  # an empty element: its one tag is back already
            return ""
        name = re.match(r"<([^\s/>]+)", original)
        return f"</{name.group(1)}>" if name else m.group()

    return _RENAMED.sub(back, text)
