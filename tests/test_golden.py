"""The shipped English to Portuguese model translates fixed sentences exactly as when it was trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from model import checkpoint
from model.search import generate

SHIPPED = Path(__file__).resolve().parents[1] / "weights" / "en-pt"

GOLDEN = {
    "Save changes before closing?": "Salvar alterações antes de fechar?",
    "The file could not be opened.": "Não foi possível abrir o arquivo.",
    "Are you sure you want to delete this folder?": "Você tem certeza de que deseja excluir esta pasta?",
    "Error while reading the configuration file.": "Erro ao ler o arquivo de configuração.",
    "Please enter your password to continue.": "Por favor, digite sua senha para continuar.",
    "This package provides a command-line tool for converting images.":
        "Este pacote fornece uma ferramenta de linha de comando para converter imagens.",
}


@pytest.fixture(scope="module")
def shipped() -> checkpoint.LoadedModel:
    return checkpoint.load(SHIPPED, device="cpu")


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
