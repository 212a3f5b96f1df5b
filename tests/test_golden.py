"""The shipped models (en-pt, pt-en) translate fixed sentences exactly as when they were trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from model import checkpoint
from model.search import generate
from server.plan import join, make_plan
from tests.helpers import server_settings

WEIGHTS = Path(__file__).resolve().parents[1] / "weights"
SHIPPED = WEIGHTS / "en-pt"

GOLDEN = {
    "Save changes before closing?": "Salvar alterações antes de fechar?",
    "The file could not be opened.": "Não foi possível abrir o arquivo.",
    "Are you sure you want to delete this folder?": "Você tem certeza de que deseja excluir esta pasta?",
    "Error while reading the configuration file.": "Erro ao ler o arquivo de configuração.",
    "Please enter your password to continue.": "Por favor, digite sua senha para continuar.",
    "This package provides a command-line tool for converting images.":
        "Este pacote fornece uma ferramenta de linha de comando para converter imagens.",
}


# The same sentences back from Portuguese: what the pt-en model wrote when it shipped, greedy and beam 4 alike.
# Earlier releases wrote "Could not open the file." with beam 4, and some greedy too.
GOLDEN_PT_EN = {
    "Salvar alterações antes de fechar?": "Save changes before closing?",
    "Não foi possível abrir o arquivo.": "Could not open file.",
    "Você tem certeza de que deseja excluir esta pasta?": "Are you sure you want to delete this folder?",
    "Erro ao ler o arquivo de configuração.": "Error reading configuration file.",
    "Por favor, digite sua senha para continuar.": "Please enter your password to continue.",
    "Este pacote fornece uma ferramenta de linha de comando para converter imagens.":
        "This package provides a command line tool to convert images.",
}

# Inline elements translated with their sentence and put back around the words aligned with theirs (format html)
GOLDEN_HTML = {
    "<p>This is a <strong>very important</strong> message for all users.</p>":
        "<p>Esta é uma mensagem <strong>muito importante</strong> para todos os usuários.</p>",
    '<li><a href="x">Delete <em>all</em> files</a> in the folder.</li>':
        '<li><a href="x">Excluir <em>todos</em> os arquivos</a> na pasta.</li>',
    "<p>The file <code>config.toml</code> could not be saved.</p>":
        "<p>O arquivo <code>config.toml</code> não pôde ser salvo.</p>",  # the release before wrote "Não foi
    # possível salvar o arquivo <code>config.toml</code>.", the one before it this
    "<p>Select <b>File &gt; Save As</b> to save a copy of the document.</p>":
        "<p>Selecione <b>Arquivo &gt; Salvar como</b> para salvar uma cópia do documento.</p>",
}


@pytest.fixture(scope="module")
def shipped() -> checkpoint.LoadedModel:
    return checkpoint.load(SHIPPED, device="cpu")


@pytest.fixture(scope="module")
def shipped_pt_en() -> checkpoint.LoadedModel:
    return checkpoint.load(WEIGHTS / "pt-en", device="cpu")


def test_shipped_model_is_complete(shipped: checkpoint.LoadedModel) -> None:
    for name in ("MODEL_CARD.md", "NOTICE", "generation.json"):
        assert (SHIPPED / name).is_file(), name
    assert (shipped.info.source_language, shipped.info.target_language) == ("en", "pt")


@pytest.mark.parametrize("beam_size", [1, 4])
def test_golden_translations(shipped: checkpoint.LoadedModel, beam_size: int) -> None:
    config = shipped.generation.update(beam_size=beam_size)
    sources = [shipped.tokenizer.encode(s) for s in GOLDEN]
    got = [shipped.tokenizer.decode(h[0].tokens) for h in generate(shipped.net, sources, config)]
    assert dict(zip(GOLDEN, got, strict=True)) == GOLDEN


def test_shipped_pt_en_model_is_complete(shipped_pt_en: checkpoint.LoadedModel) -> None:
    for name in ("MODEL_CARD.md", "NOTICE", "generation.json"):
        assert (WEIGHTS / "pt-en" / name).is_file(), name
    assert (shipped_pt_en.info.source_language, shipped_pt_en.info.target_language) == ("pt", "en")


@pytest.mark.parametrize("beam_size", [1, 4])
def test_golden_translations_pt_en(shipped_pt_en: checkpoint.LoadedModel, beam_size: int) -> None:
    m = shipped_pt_en
    sources = [m.tokenizer.encode(s) for s in GOLDEN_PT_EN]
    got = [m.tokenizer.decode(h[0].tokens) for h in generate(m.net, sources, m.generation.update(beam_size=beam_size))]
    assert dict(zip(GOLDEN_PT_EN, got, strict=True)) == GOLDEN_PT_EN


def test_golden_inline_html(shipped: checkpoint.LoadedModel) -> None:
    pages = list(GOLDEN_HTML)
    plan = make_plan(pages, shipped.tokenizer, html=True, max_source_tokens=256)
    aligned = shipped.generation.update(alignment=True)
    configs = [aligned if s in plan.markup else shipped.generation for s in range(len(plan.sources))]
    best = {s: h[0] for s, h in enumerate(generate(shipped.net, plan.sources, configs))}
    got = [join(plan, t, best, shipped.tokenizer) for t in range(len(pages))]
    assert dict(zip(pages, got, strict=True)) == GOLDEN_HTML


def test_alternatives_of_the_shipped_model_differ() -> None:
    """Beam search's n-best holds token sequences that read the same ("Abrir o arquivo." twice) and the translation
    itself: an answer's alternatives are distinct, none the translation, fewer when the beam holds no more."""
    from fastapi.testclient import TestClient

    from server.app import create_app

    texts = ["Open the file.", "Delete", "Save changes before closing?"]
    with TestClient(create_app(server_settings(SHIPPED, scheduler_process=False))) as client:
        r = client.post("/translate", json={"q": texts, "source": "en", "target": "pt", "alternatives": 4})
    assert r.status_code == 200, r.text
    for text, others in zip(r.json()["translatedText"], r.json()["alternatives"], strict=True):
        assert others and len(others) <= 4 and len(set(others)) == len(others) and text not in others, (text, others)
