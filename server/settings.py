"""Server configuration: one pydantic-settings class, read from `TOLK_` environment variables and a `.env` file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from limits import parse_many
from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def _split_list(value: Any) -> Any:
    """Environment lists are comma-separated (`TOLK_MODELS=weights/en-pt,weights/en-de`)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    """Everything an operator can set. Limits protect the server; defaults of generation live with each model."""

    model_config = SettingsConfigDict(env_prefix="TOLK_", env_file=".env", extra="ignore")

    # Models
    models: Annotated[list[Path], NoDecode] = Field(
        default_factory=list, description="model directories; empty = every model directory under weights_dir"
    )
    weights_dir: Path = Field(default=Path("weights"), description="where model directories are found")
    device: str = Field(default="auto", description="auto | cpu | cuda | cuda:N")
    dtype: Literal["auto", "float32", "float16", "bfloat16", "int8", "float16w"] = Field(
        default="auto", description="auto = int8 on the CPU (quantized linear layers: 1.3 to 3 times as fast, within "
        "0.2 BLEU of float32 on the shipped model), float32 on a GPU; float16w (CPU): float16 weights, float32 "
        "arithmetic, each sentence's result independent of what shares its batch"
    )
    int8: Literal["auto", "rows", "ranges", "dynamic"] = Field(
        default="auto", description="how int8 products quantize their input: auto = the fixed ranges of a model's "
        "int8.json when it has one, else a scale per input row (both keep a sentence's result independent of its "
        "batch); dynamic = one scale per call over the batch (faster on large models without int8.json, and a "
        "sentence can change with its batch)"
    )
    threads: int | None = Field(default=None, ge=1, le=256, description="torch threads of each scheduler; None = "
                                 "every core but one on the CPU (the event loop needs one), torch's default on a GPU")

    cuda_graphs: bool = Field(default=True, description="on a CUDA device, replay the decoder step as CUDA graphs "
                              "recorded at start-up (one per bucket of row counts): one launch instead of dozens")

    # Scheduling
    scheduler_process: bool = Field(default=True, description="each model's scheduler in a process of its own, so "
                                    "decoding and the event loop do not take turns on one GIL (on 2 cores, 32 clients: "
                                    "1.3 to 1.4 times the sentences/s, 1.1 to 1.9 times streamed); False = a "
                                    "thread of the server process")
    batching: bool = Field(default=True, description="continuous batching; False decodes one sentence at a time")
    encode_ahead: bool = Field(default=True, description="on the CPU, sentences joining a batch that is decoding "
                               "are encoded on a second thread while the decoder steps on (server/batcher.py)")
    steps_at_once_ms: float = Field(default=2.0, ge=0, le=1000, description="on the CPU, while no sentence waits "
                                    "to join, plain greedy steps run at once in one compiled call (and plain beam "
                                    "searches of a few rows in one loop) for about this long (from the last "
                                    "steps' times), without the Python between steps; a request that arrives "
                                    "meanwhile waits at most about this long to join, and streamed tokens come in "
                                    "bursts as long; 0 = one step at a time")
    max_batch_rows: int = Field(default=32, ge=1, le=1024, description="cache rows decoding together")
    max_request_rows: int | None = Field(default=None, ge=1, le=1024, description="rows one request may hold "
                                         "(a beam takes beam_size rows), so that the rest are free for the next "
                                         "request at the next step; None = three quarters of max_batch_rows")
    max_admit_tokens: int = Field(default=4096, ge=1, description="source tokens encoded in one admission step")
    max_source_tokens: int = Field(default=256, ge=8, le=4096, description="longest sentence; longer ones are split")
    max_queue: int = Field(default=1024, ge=1, description="sentences waiting for rows before requests get 429")
    request_timeout: float = Field(default=60.0, gt=0, description="seconds to wait and decode before a 504")
    max_loaded_models: int = Field(
        default=0, ge=0, description="0: every model loads at start and stays. N: a model loads on its first request, "
        "at most N at once; to make room the least recently used idle one is unloaded")
    unload_after: float = Field(default=0.0, ge=0, description="with max_loaded_models: seconds a model may idle "
                                "before it is unloaded (0: only to make room)")
    watchdog_interval: float = Field(default=1.0, gt=0, description="seconds between checks that restart a "
                                     "dead scheduler thread")
    translation_cache_entries: int = Field(default=10000, ge=0, description="finished sentences kept per model "
                                           "and answered again without decoding (same source, same settings; "
                                           "sampling is never kept), bounded as this many sentences of 64 tokens "
                                           "(source and translations); 0 = off")
    cache_url: str | None = Field(default=None, description="redis://host:port/db: the translation cache lives in "
                                  "Redis, shared by every replica serving the same model files "
                                  "(TOLK_TRANSLATION_CACHE_ENTRIES is then unused; bound it with Redis's maxmemory)")
    cache_ttl: float = Field(default=7 * 86400, gt=0, description="seconds a sentence stays in the Redis cache")
    retry_after: int = Field(default=1, ge=1, description="seconds suggested in Retry-After with a 429")

    # Limits of requests
    max_text_chars: int = Field(default=5000, ge=1, description="characters in one text")
    max_texts: int = Field(default=128, ge=1, description="texts in one request")
    max_body_bytes: int = Field(default=1 << 20, ge=1024, description="bytes in one request body")
    max_new_tokens: int = Field(default=512, ge=1, le=1024, description="largest max_new_tokens a request may ask")
    max_beam_size: int = Field(default=8, ge=1, le=16)
    max_alternatives: int = Field(default=4, ge=0, le=15)

    # File translation (POST /translate_file)
    files: bool = Field(default=True, description="translate files; False answers 403, as LibreTranslate does "
                        "with files off")
    max_file_bytes: int = Field(default=10 << 20, ge=1024, description="bytes of one uploaded file")
    max_file_chars: int = Field(default=200_000, ge=1, description="characters to translate in one file")
    max_file_expanded_bytes: int = Field(default=64 << 20, ge=1024, description="bytes of a zipped document "
                                         "(docx, pptx, odt, odp, epub) once decompressed, all entries together")
    max_file_entries: int = Field(default=2000, ge=1, description="entries in a zipped document")
    max_file_nodes: int = Field(default=1_000_000, ge=100, description="elements and attributes of the markup "
                                "read from one file (XML parts, HTML pages), counted in its bytes before any parse")
    file_ttl: float = Field(default=1800.0, gt=0, description="seconds a translated file can be downloaded")
    file_timeout: float = Field(default=1800.0, gt=0, description="seconds a file's translation may wait and decode "
                                "before it fails with 504 (TOLK_REQUEST_TIMEOUT is for requests of texts)")
    file_store_bytes: int = Field(default=512 << 20, ge=1024, description="bytes of translated files kept at "
                                  "once; the oldest are dropped first")
    file_dir: Path | None = Field(default=None, description="where translated files are kept (in a directory of "
                                  "their own, removed at stop); None = the system's temporary directory")
    max_document_jobs: int = Field(default=8, ge=1, description="documents queued or translating at once through "
                                   "POST /documents (all clients together); beyond it 429")
    file_workers: int = Field(default=2, ge=1, le=64, description="files read or rebuilt at once, each in a process "
                              "of its own that ends with it, so that its memory goes back to the system")
    max_files_waiting: int = Field(default=32, ge=0, description="files waiting for a worker to read or rebuild "
                                   "them; beyond it 429")

    # Glossaries (POST /glossaries, glossary_id)
    data_dir: Path = Field(default=Path("data/server"), description="where the server keeps what must outlive a "
                           "restart (glossaries, in SQLite); created when missing")
    max_glossaries: int = Field(default=1000, ge=0, description="glossaries kept, all API keys together")
    max_glossary_entries: int = Field(default=10_000, ge=1, description="entries in one glossary")
    max_glossary_term_chars: int = Field(default=200, ge=1, description="characters in one glossary term (and name)")

    # Usage (DeepL's GET /v2/usage)
    character_limit: int | None = Field(default=None, ge=1, description="characters each API key (without keys: "
                                        "all clients together) may translate in a calendar month (UTC), counted "
                                        "in data_dir; beyond it 456, as DeepL answers; None = no limit")

    # HTTP
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="empty = CORS off")
    api_keys: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list, description="empty = no key needed to translate"
    )
    admin_key: SecretStr | None = Field(default=None, description="needed to change defaults at run time")
    rate_limit: str | None = Field(
        default=None, description='translate requests per client (API key, else address): "60/minute", '
        '"10/second;1000/hour"; None = no limit'
    )
    rate_limit_storage: str = Field(default="memory://", description="where the counts live (a `limits` URI)")

    @field_validator("models", "cors_origins", "api_keys", mode="before")
    @classmethod
    def _lists(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("rate_limit")
    @classmethod
    def _rate(cls, value: str | None) -> str | None:
        if value:
            parse_many(value)  # ValueError on a malformed rule, at start-up rather than at the first request
        return value or None

    def public(self) -> dict[str, Any]:
        """The limits a client may see (no paths, no keys)."""
        return self.model_dump(
            include={
                "batching", "max_batch_rows", "max_source_tokens", "max_queue", "request_timeout", "max_text_chars",
                "max_texts", "max_body_bytes", "max_new_tokens", "max_beam_size", "max_alternatives", "files",
                "max_file_bytes", "max_file_chars", "max_file_expanded_bytes", "max_file_entries", "file_ttl",
                "file_timeout", "max_file_nodes",
                "max_document_jobs", "max_glossaries", "max_glossary_entries", "max_glossary_term_chars",
            }
        ) | {"api_key_required": bool(self.api_keys), "rate_limit": self.rate_limit}
