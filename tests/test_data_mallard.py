"""Mallard help pages aligned block by block, and sources that join train after dev and test were drawn (no network,
no downloads: the pages are written here as itstool writes them)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from model.data.pairs import Pair
from model.data.sources.mallard_help import aligned_blocks, help_pairs, page_blocks
from model.data.split import add_train_only, source_key, split_by_source

EN = """<page xmlns="http://projectmallard.org/1.0/" type="topic" id="files-rename">
  <info>
    <revision pkgversion="3.18" date="2015-09-29" status="final"/>
    <credit type="author"><name>GNOME Documentation Project</name></credit>
    <desc>Change file or folder name.</desc>
  </info>
  <title>Rename a file or folder</title>
  <p>As with other file managers, you can use <app>Files</app> to change the
  name of a file or folder.</p>
  <steps>
    <item><p>Right-click on the item and select <gui>Rename</gui>. Type the new name.</p></item>
  </steps>
  <p>You can also rename a file from the <link xref="nautilus-file-properties-basic"/> window.</p>
  <code>mv old new</code>
</page>
"""

PT = """<?xml version="1.0" encoding="utf-8"?>
<page xmlns="http://projectmallard.org/1.0/" type="topic" id="files-rename" xml:lang="pt-BR">
  <info>
    <revision pkgversion="3.18" date="2015-09-29" status="final"/>
    <credit type="author"><name>Projeto de documentação do GNOME</name></credit>
    <desc>Altere o nome do arquivo ou da pasta.</desc>
    <mal:credit xmlns:mal="http://projectmallard.org/1.0/" type="translator copyright">
      <mal:name>Tradutor</mal:name><mal:years>2013.</mal:years>
    </mal:credit>
  </info>
  <title>Renomeando um arquivo ou pasta</title>
  <p>Assim como em outros gerenciadores de arquivos, você pode usar o <app>Arquivos</app> para
  alterar o nome de um arquivo ou pasta.</p>
  <steps>
    <item><p>Clique com o botão direito no item e selecione <gui>Renomear</gui>. Digite o novo nome.</p></item>
  </steps>
  <p>Você também pode renomear um arquivo a partir da janela <link xref="nautilus-file-properties-basic"/>.</p>
  <code>mv antigo novo</code>
</page>
"""


def _tree(root: Path, lang: str, name: str, text: str) -> None:
    path = root / "usr/share/help" / lang / "gnome-help" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_page_and_its_translation_align_block_by_block(tmp_path: Path) -> None:
    _tree(tmp_path, "C", "files-rename.page", EN)
    _tree(tmp_path, "pt_BR", "files-rename.page", PT)
    # an outdated translation: one paragraph more than its English page
    _tree(tmp_path, "C", "old.page", EN)
    _tree(tmp_path, "pt_BR", "old.page", PT.replace("</steps>", "</steps>\n  <p>Um parágrafo a mais.</p>"))
    _tree(tmp_path, "C", "untranslated.page", EN)  # no pt_BR page
    stats: Counter[str] = Counter()
    pairs = list(help_pairs(tmp_path, stats))
    assert stats == {"pages": 1, "pages_misaligned": 1}
    assert pairs == [
        ("Change file or folder name.", "Altere o nome do arquivo ou da pasta."),
        ("Rename a file or folder", "Renomeando um arquivo ou pasta"),
        ("As with other file managers, you can use Files to change the name of a file or folder.",
         "Assim como em outros gerenciadores de arquivos, você pode usar o Arquivos para alterar o nome de um "
         "arquivo ou pasta."),
        # a block's sentences pair one to one when their counts agree
        ("Right-click on the item and select Rename.", "Clique com o botão direito no item e selecione Renomear."),
        ("Type the new name.", "Digite o novo nome."),
    ]  # credits, revisions and code are not text to translate; the link Mallard fills in leaves a hole: skipped


def test_blocks_keep_their_place_when_their_text_is_skipped(tmp_path: Path) -> None:
    """A skipped block still counts in the structure, so the blocks after it pair with their own translations."""
    en, pt = tmp_path / "en.page", tmp_path / "pt.page"
    en.write_text(EN, encoding="utf-8")
    pt.write_text(PT, encoding="utf-8")
    blocks = page_blocks(en)
    assert blocks is not None and [tag for tag, _ in blocks] == ["desc", "title", "p", "p", "p"]
    assert blocks[-1] == ("p", None)
    assert aligned_blocks(en, pt) is not None
    pt.write_text(PT.replace("<title>Renomeando", "<subtitle>Renomeando").replace("pasta</title>", "pasta</subtitle>"),
                  encoding="utf-8")
    assert aligned_blocks(en, pt) is None  # a different structure: nothing of the page is trusted
    pt.write_text("<page>not closed", encoding="utf-8")
    assert aligned_blocks(en, pt) is None


def _pair(en: str, pt: str, source: str) -> Pair:
    return Pair(en, pt, source, "pkg")


def test_sources_added_later_leave_dev_and_test_as_they_were() -> None:
    first = [_pair(f"Sentence number {i} is here to stay", f"Frase número {i} fica aqui", "gettext")
             for i in range(60)]
    splits = split_by_source(first, {"dev": 10, "test": 10}, seed=7)
    held = {source_key(p.en) for name in ("dev", "test") for p in splits[name]}
    a_test_sentence = splits["test"][0].en
    a_train_sentence = splits["train"][0].en
    later = [_pair(f"Open the help page number {i} now", f"Abra a página de ajuda número {i} agora", "mallard")
             for i in range(40)]
    later += [_pair(a_test_sentence, "Outra tradução", "mallard"),  # would leak the test split into train
              _pair(a_train_sentence, "Mais uma tradução", "mallard")]  # a second translation of a train sentence
    out = add_train_only(splits, later, {"prose": 5}, seed=7)
    assert out["dev"] == splits["dev"] and out["test"] == splits["test"]
    assert len(out["prose"]) == 5 and all(p.source == "mallard" for p in out["prose"])
    prose = {source_key(p.en) for p in out["prose"]}
    train = {source_key(p.en) for p in out["train"]}
    assert not prose & train and not prose & held and not train & held
    assert not any(p.pt == "Outra tradução" for name in out for p in out[name])
    assert _pair(a_train_sentence, "Mais uma tradução", "mallard") in out["train"]
    assert len(out["train"]) == len(splits["train"]) + 40 - 5 + 1
