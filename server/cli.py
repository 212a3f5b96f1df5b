"""The `tolk` console script: serve, translate, and the recipe commands that live in model/.

The recipe commands (data build, train, eval, import, export-marian, pull) come from modules others own; each
exposes `add_arguments(parser)` and `main(args) -> int`. They are imported while the parser is built, and a module
that cannot be imported only disables its own command, so `tolk serve` works whatever else is missing.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model import runtime

if TYPE_CHECKING:
    from server.settings import Settings

log = logging.getLogger("tolk")

Run = Callable[[argparse.Namespace], int]

# (subcommand path, module, function adding its arguments, function running it, help)
RECIPES: list[tuple[tuple[str, ...], str, str, str, str]] = [
    (("data", "build"), "model.data.build", "add_arguments", "main", "build the training corpus"),
    (("data", "distill"), "model.data.distill", "add_arguments", "main",
     "translate WordNet's English examples with the Firefox Translations model: extra training pairs"),
    (("data", "dictionary"), "model.data.dictionary", "add_arguments", "main",
     "FreeDict's English-Portuguese and Portuguese-English dictionaries as word pairs for training"),
    (("data", "edu"), "model.data.edu", "add_arguments", "main",
     "children's educational software (GCompris, Tux Paint's stamps) and its Brazilian Portuguese: training pairs"),
    (("data", "help"), "model.data.help", "add_arguments", "main",
     "the corpus's GNOME help pairs that its train split holds, as a folder a fine-tuning mix can repeat"),
    (("train",), "model.train", "add_arguments", "main", "train a model"),
    (("eval",), "model.evaluate", "add_arguments", "main", "score a model on a test set"),
    (("import",), "model.argos", "add_import_arguments", "import_main",
     "import a Marian / OPUS-MT checkpoint, CTranslate2 model or Argos package (SRC OUT_DIR)"),
    (("import-marian",), "model.argos", "add_import_arguments", "import_main", "alias of tolk import"),
    (("export-marian",), "model.marian", "add_export_arguments", "export_main",
     "export a model directory as a Hugging Face Marian checkpoint (MODEL_DIR HF_DIR)"),
    (("build-kernels",), "model.native_build", "add_arguments", "main",
     "compile the CPU kernels ahead for these models on this machine: servers then run them without numba"),
    (("extend-source-vocab",), "model.source_vocab", "add_arguments", "main",
     "copy a model directory with its source vocabulary extended by whole words of the source language (MODEL OUT)"),
    (("translate-dataset",), "server.datasets.command", "add_arguments", "main",
     "translate a column of a Parquet, JSON Lines or CSV dataset, here or on a Ray cluster; resumable (docs/bulk.md)"),
    (("pull",), "model.pull", "add_arguments", "main",
     "download and import a Hugging Face Marian / OPUS-MT checkpoint (e.g. Helsinki-NLP/opus-mt-en-de) or an Argos "
     "package (argos:FROM-TO)"),
]


def _unavailable(command: str, module: str, reason: str, args: argparse.Namespace) -> int:
    print(f"tolk {command} is not available: importing {module} failed ({reason})", file=sys.stderr)
    return 2


def _add_recipe(subparsers: Any, name: str, module: str, add: str, run: str, help_: str, command: str) -> None:
    parser = subparsers.add_parser(name, help=help_, description=help_)
    try:
        mod = importlib.import_module(module)
        getattr(mod, add)(parser)
        parser.set_defaults(handler=getattr(mod, run))
    except (ImportError, AttributeError) as exc:
        parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        parser.set_defaults(handler=partial(_unavailable, command, module, str(exc)))


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", action="append", type=Path, metavar="DIR",
                        help="model directory (repeatable); default: every directory under weights/ or TOLK_MODELS")
    parser.add_argument("--pull", metavar="PAIRS",
                        help="comma-separated language pairs (en-de: an Argos package) or pull IDs (argos:en-de, "
                             "Helsinki-NLP/opus-mt-en-de) downloaded into weights/ before serving, unless there")
    parser.add_argument("--device", help="auto | cpu | cuda | cuda:N (default: TOLK_DEVICE or auto)")
    parser.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16", "int8", "float16w"])
    parser.add_argument("--int8", choices=["auto", "rows", "ranges", "dynamic"],
                        help="int8's arithmetic (default: TOLK_INT8 or auto; docs/server.md)")
    parser.add_argument("--threads", type=int, help="torch threads per model")
    parser.add_argument("--no-batching", action="store_true", help="decode one sentence at a time")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--drain-timeout", type=float, metavar="SECONDS",
                        help="after SIGTERM, how long in-flight requests may finish before they are cancelled "
                             "(default: TOLK_REQUEST_TIMEOUT + 5)")


def serve(args: argparse.Namespace) -> int:
    """Start uvicorn with create_app; settings come from the environment, then from these flags."""
    import uvicorn

    from server.app import create_app
    from server.registry import NoModels, model_dirs
    from server.settings import Settings

    overrides: dict[str, Any] = {k: v for k, v in (
        ("models", args.model), ("device", args.device), ("dtype", args.dtype), ("threads", args.threads),
        ("int8", args.int8),
    ) if v}
    if args.no_batching:
        overrides["batching"] = False
    settings = Settings(**overrides)
    try:
        if args.pull:
            pulled = pull_missing(args.pull, settings)
            if settings.models:  # served alongside the named ones
                settings = Settings(**{**overrides, "models": [*settings.models, *pulled]})
    except (ValueError, OSError) as exc:
        print(f"tolk serve: --pull: {exc}", file=sys.stderr)
        return 1
    try:
        model_dirs(settings)
    except NoModels as exc:
        print(f"tolk serve: {exc}", file=sys.stderr)
        return 2
    # On SIGTERM uvicorn stops accepting, lets in-flight requests finish, then runs the lifespan's shutdown. No
    # request outlives request_timeout, so a longer drain would only wait on clients that read too slowly.
    drain = args.drain_timeout if args.drain_timeout is not None else settings.request_timeout + 5
    uvicorn.run(create_app(settings), host=args.host, port=args.port, log_level=args.log_level,
                timeout_graceful_shutdown=max(1, round(drain)))
    return 0


def pull_missing(items: str, settings: Settings) -> list[Path]:
    """`--pull`: each pair no model directory under weights_dir translates yet, pulled (a bare pair as an Argos
    package, as LibreTranslate's --load-only names them); IDs as `tolk pull` takes them. The directories pulled."""
    from model.argos import pull_argos
    from model.checkpoint import ModelInfo
    from model.pull import pull
    from server.languages import match

    infos = [ModelInfo.load(p) for p in sorted(settings.weights_dir.glob("*/info.json"))]
    have = {(i.source_language, i.target_language) for i in infos}
    pulled: list[Path] = []
    for item in filter(None, (i.strip() for i in items.split(","))):
        if item.startswith("argos:"):
            pulled.append(pull_argos(item.removeprefix("argos:"), weights_dir=settings.weights_dir))
        elif "/" in item:
            pulled.append(pull(item, weights_dir=settings.weights_dir))
        else:
            source, _, target = item.partition("-")
            if not any(match(source, [s]) and match(target, [t]) for s, t in have):  # as requests find models
                log.info("pulling argos:%s", item)
                pulled.append(pull_argos(item, weights_dir=settings.weights_dir))
    return pulled


def _translate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=Path, metavar="DIR", help="model directory (default: the first under weights/)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "int8", "float16w"])
    parser.add_argument("--beam-size", type=int)
    parser.add_argument("--sample", action="store_true", help="sample instead of the most likely tokens")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--batch-lines", type=int, default=256, help="lines translated together")
    parser.add_argument("--rows", type=int, default=64, help="sequences decoding together")


def _chunks(lines: Iterator[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in lines:
        chunk.append(line.rstrip("\n"))
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translate(args: argparse.Namespace) -> int:
    """Read lines on stdin, write their translations on stdout (no server; sentences batched together)."""
    from model.checkpoint import load
    from model.search import generate
    from server.plan import join, make_plan
    from server.registry import NoModels, model_dirs
    from server.settings import Settings

    try:
        directory = args.model or model_dirs(Settings())[0]
    except NoModels as exc:
        print(f"tolk translate: {exc}", file=sys.stderr)
        return 2
    loaded = load(directory, device=args.device, dtype=args.dtype)
    changes = {k: v for k, v in (
        ("beam_size", args.beam_size), ("temperature", args.temperature), ("top_k", args.top_k),
        ("top_p", args.top_p), ("seed", args.seed), ("max_new_tokens", args.max_new_tokens),
    ) if v is not None}
    if args.sample:
        changes["do_sample"] = True
    try:
        config = loaded.generation.update(**changes)
    except ValueError as exc:
        print(f"tolk translate: {exc}", file=sys.stderr)
        return 2
    tok = loaded.tokenizer
    max_src = loaded.model.cfg.max_positions
    for lines in _chunks(iter(sys.stdin), args.batch_lines):
        plan = make_plan(lines, tok, html=False, max_source_tokens=max_src)
        hyps = generate(loaded.net, plan.sources, config, max_rows=args.rows) if plan.sources else []
        best = {i: h[0] for i, h in enumerate(hyps)}
        for t in range(len(lines)):
            print(join(plan, t, best, tok), flush=False)
        sys.stdout.flush()
    return 0


def _translate_file_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, metavar="INPUT", help="the document (its extension says its format)")
    parser.add_argument("-o", "--output", type=Path, metavar="OUTPUT",
                        help="where the translation goes (default: INPUT's folder, named <name>_<target><ext>)")
    parser.add_argument("--source", default="auto", help="language code, or auto (default): detected by the server")
    parser.add_argument("--target", help="language code (may be omitted when one model serves the source)")
    parser.add_argument("--server", default="http://127.0.0.1:8000", metavar="URL",
                        help="a running Tolk server (default: %(default)s)")
    parser.add_argument("--api-key", help="the server's API key, when it has keys (default: TOLK_API_KEY)")
    parser.add_argument("--poll", type=float, default=0.5, metavar="SECONDS", help="seconds between status checks")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


class ClientError(Exception):
    """What stops `tolk translate-file`, as one line for the user."""


def _checked(response: Any) -> Any:
    """The response, or ClientError with the server's own message for a 4xx or 5xx."""
    if response.status_code < 400:
        return response
    try:
        message = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        message = response.text.strip()[:200] or response.reason_phrase
    raise ClientError(f"the server answered {response.status_code}: {message}")


def translate_document(path: Path, output: Path | None, server: str, source: str, target: str | None,
                       api_key: str | None, poll: float, progress: bool) -> Path:
    """Upload, poll the status (moving the progress bar), download; where the translation was written."""
    import httpx
    from tqdm import tqdm

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror}") from exc
    fields = {k: v for k, v in (("source_lang", source), ("target_lang", target), ("api_key", api_key)) if v}
    base = server.rstrip("/")
    try:
        with httpx.Client(timeout=60.0) as client:
            handle = _checked(client.post(f"{base}/documents", files={"file": (path.name, data)},
                                          data=fields)).json()
            key = {"document_key": handle["document_key"], **({"api_key": api_key} if api_key else {})}
            status_url = f"{base}/documents/{handle['document_id']}"
            with tqdm(total=100, unit="%", desc=path.name, disable=not progress,
                      bar_format="{l_bar}{bar}| {n:.0f}% [{elapsed}<{remaining}]") as bar:
                while True:
                    status = _checked(client.post(status_url, data=key)).json()
                    bar.update(100 * status["progress"] - bar.n)
                    if status["status"] == "error":
                        raise ClientError(f"the server could not translate {path.name}: {status['error_message']}")
                    if status["status"] == "done":
                        break
                    time.sleep(poll)
            result = _checked(client.post(f"{status_url}/result", data=key))
    except httpx.TransportError as exc:
        raise ClientError(f"cannot reach the server at {server} ({exc.__class__.__name__}); is `tolk serve` "
                          "running?") from exc
    if output is None:
        name = result.headers.get("content-disposition", "").partition('filename="')[2].rstrip('"')
        output = path.with_name(name or f"{path.stem}_{target or 'translated'}{path.suffix}")
    try:
        output.write_bytes(result.content)
    except OSError as exc:
        raise ClientError(f"cannot write {output}: {exc.strerror}") from exc
    return output


def translate_file(args: argparse.Namespace) -> int:
    """Translate a document through a running server's POST /documents, with a progress bar from its status."""
    try:
        output = translate_document(args.input, args.output, args.server, args.source, args.target,
                                    args.api_key or os.environ.get("TOLK_API_KEY"), args.poll, not args.quiet)
    except ClientError as exc:
        print(f"tolk translate-file: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"tolk translate-file: wrote {output}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tolk", description="Tolk: self-hosted machine translation")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("serve", help="start the translation server")
    _serve_arguments(p)
    p.set_defaults(handler=serve)
    p = sub.add_parser("translate", help="translate stdin lines to stdout")
    _translate_arguments(p)
    p.set_defaults(handler=translate)
    p = sub.add_parser("translate-file", help="translate a document through a running server, with a progress bar",
                       description="Translate a document (any format POST /translate_file takes: GET "
                       "/frontend/settings lists them) through a running Tolk server's POST /documents, keeping its "
                       "formatting.")
    _translate_file_arguments(p)
    p.set_defaults(handler=translate_file)
    groups: dict[str, Any] = {}
    for path, module, add, run, help_ in RECIPES:
        target = sub
        if len(path) == 2:
            if path[0] not in groups:
                group = sub.add_parser(path[0], help=f"{path[0]} commands")
                groups[path[0]] = group.add_subparsers(dest=f"{path[0]}_command", metavar="COMMAND", required=True)
            target = groups[path[0]]
        _add_recipe(target, path[-1], module, add, run, help_, " ".join(path))
    return parser


def main(argv: list[str] | None = None) -> int:
    runtime.configure()  # before the parser imports the recipes, and with them torch
    parser = build_parser()
    args = parser.parse_args(argv)
    run: Run | None = getattr(args, "handler", None)
    if run is None:
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll would bury the progress bar
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
