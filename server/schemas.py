"""Request and response bodies. /translate follows LibreTranslate's shape, plus `options` and `details`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# What a tensor of the decode step can hold: a larger option (top_k = 2**64) would fail the whole batch's step.
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]


class GenerationOptions(BaseModel):
    """Per-request generation settings; unset fields take the model's defaults (GET /settings)."""

    model_config = ConfigDict(extra="forbid")

    beam_size: Int64 | None = Field(default=None, description="1 = greedy or sampling; >1 = beam search")
    num_hypotheses: Int64 | None = Field(default=None, description="n-best kept by beam search")
    length_penalty: float | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: Int64 | None = None
    top_p: float | None = None
    seed: Int64 | None = Field(default=None, description="makes sampling reproducible")
    repetition_penalty: float | None = None
    no_repeat_ngram_size: Int64 | None = None
    min_new_tokens: Int64 | None = None
    max_new_tokens: Int64 | None = None
    replace_unknowns: bool | None = Field(default=None, description="write a generated unknown token as the source "
                                          "piece it attends to most, as argostranslate does (its imports default to "
                                          "true)")
    return_scores: bool = Field(default=False, description="add `details` (scores, token counts) to the answer")

    def generation(self) -> dict[str, Any]:
        """The fields that change GenerationConfig."""
        return self.model_dump(exclude_none=True, exclude={"return_scores"})


class TranslateRequest(BaseModel):
    """LibreTranslate's request; `target` may be omitted when only one model serves the source."""

    model_config = ConfigDict(extra="forbid")

    q: str | list[str] = Field(description="a text or a list of texts", examples=["Open the file."])
    source: str = Field(default="auto", description="language code, or 'auto': each text's language is detected "
                        "among those with a model into the target",
                        examples=["en"])
    target: str | None = Field(default=None, description="language code", examples=["pt"])
    format: Literal["text", "html"] = "text"
    alternatives: int = Field(default=0, ge=0, description="extra translations per text (beam search n-best)")
    api_key: str | None = None
    glossary_id: str | None = Field(default=None, description="a glossary (POST /glossaries) whose terms the "
                                    "translations must use; its languages must be the request's")
    options: GenerationOptions = Field(default_factory=GenerationOptions)

    @property
    def texts(self) -> list[str]:
        return [self.q] if isinstance(self.q, str) else self.q


class DetectRequest(BaseModel):
    """LibreTranslate's /detect request."""

    model_config = ConfigDict(extra="forbid")

    q: str | list[str] = Field(description="a text, or a list of texts that get one ranking together",
                               examples=["What language is this?"])
    api_key: str | None = None

    @property
    def texts(self) -> list[str]:
        return [self.q] if isinstance(self.q, str) else self.q


class DetectedLanguage(BaseModel):
    confidence: float = Field(ge=0, le=100, description="the probability of the language among the languages this "
                              "server translates from, in percent")
    language: str


class TextDetails(BaseModel):
    finish_reason: str
    input_tokens: int
    generated_tokens: int
    scores: list[float] = Field(description="score of the best hypothesis of each sentence")
    models: list[str] = Field(default_factory=list, description="the models that translated the text, in order: "
                              "two when it went through English")


class TranslateResponse(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    translatedText: str | list[str]
    alternatives: list[str] | list[list[str]] | None = None
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None
    details: TextDetails | list[TextDetails] | None = None


class Language(BaseModel):
    code: str
    name: str
    targets: list[str]


class SettingsUpdate(BaseModel):
    """New generation defaults of one model (or of every model when `model` is omitted)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    defaults: GenerationOptions


class LanguageChoice(BaseModel):
    code: str
    name: str


class FrontendLanguages(BaseModel):
    source: LanguageChoice
    target: LanguageChoice


class FrontendSettings(BaseModel):
    """LibreTranslate's GET /frontend/settings: what its web page and clients read before they start."""

    charLimit: int = Field(description="characters in one text (-1: no limit)")
    frontendTimeout: int = Field(description="milliseconds a page waits after typing before it translates")
    apiKeys: bool = Field(description="whether the server has API keys")
    keyRequired: bool = Field(description="whether translating needs an API key")
    suggestions: bool = Field(description="whether POST /suggest takes suggestions")
    filesTranslation: bool = Field(description="whether POST /translate_file translates files")
    supportedFilesFormat: list[str] = Field(description="file name extensions /translate_file takes")
    language: FrontendLanguages = Field(description="the languages a page starts with")


class FileTranslation(BaseModel):
    """LibreTranslate's answer to POST /translate_file, and the language found when the source was auto."""

    translatedFileUrl: str = Field(description="where the translated file can be downloaded until it expires")
    detectedLanguage: DetectedLanguage | None = None


class GlossaryCreate(BaseModel):
    """DeepL's request to make a glossary: its entries as one TSV or CSV text."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(examples=["UI terms"])
    source_lang: str = Field(examples=["en"])
    target_lang: str = Field(examples=["pt"])
    entries: str = Field(description="one entry per line: source term, then target term", examples=["folder\tpasta"])
    entries_format: str = Field(default="tsv", description="tsv (tab-separated) or csv (two columns)")
    api_key: str | None = None


class GlossaryInfo(BaseModel):
    """A glossary's metadata, in DeepL's shape."""

    glossary_id: str
    name: str
    ready: bool
    source_lang: str
    target_lang: str
    creation_time: str = Field(description="ISO 8601, UTC")
    entry_count: int


class GlossaryList(BaseModel):
    glossaries: list[GlossaryInfo]


class ErrorBody(BaseModel):
    error: str
    error_type: str


RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}}


def error_responses(*codes: int, body: type[BaseModel] = ErrorBody) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for the error statuses a route answers, each with the error body (429 with Retry-After);
    `body`: the shape of another API's errors, for its routes (server/errors.py:shaped_body)."""
    return {code: {"model": body, **({"headers": RETRY_AFTER} if code == 429 else {})} for code in codes}
