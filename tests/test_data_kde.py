"""KDE handbooks: DocBook as KDE writes it (a DOCTYPE with its own entities, kdoctools' entity tables), aligned
section by section, the sections a translation did not follow left out."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from model.data.sources import kde_docbook

GENERAL = '<!ENTITY kde "<acronym>KDE</acronym>">\n<!ENTITY dolphin "<application>Dolphin</application>">\n'
USER = {"en": '<!ENTITY LMB "<mousebutton>left</mousebutton> mouse button">\n',
        "pt-BR": '<!ENTITY LMB "botão <mousebutton>esquerdo</mousebutton> do mouse">\n'}

EN = """<?xml version="1.0" ?>
<!DOCTYPE book PUBLIC "-//KDE//DTD DocBook XML V4.5-Based Variant V1.1//EN" "dtd/kdedbx45.dtd" [
  <!ENTITY kappname "&dolphin;">
  <!ENTITY % English "INCLUDE">
]>
<book id="dolphin" lang="&language;">
<chapter id="intro"><title>Introduction</title>
<para>&kappname; is the default file manager of &kde;.</para>
<screen>dolphin --split</screen>
<para>Click an item with the &LMB;<indexterm><primary>click</primary></indexterm> to open it.</para>
<para>Press &Fn; to start.</para>
<para>Type <programlisting>ls -l</programlisting> in the terminal.</para>
</chapter>
<chapter id="views"><title>Views</title>
<para>The view shows the files of the folder.</para>
<para>A new paragraph that the translation does not have yet.</para>
</chapter>
</book>
"""
PT = """<?xml version="1.0" ?>
<!DOCTYPE book PUBLIC "-//KDE//DTD DocBook XML V4.5-Based Variant V1.1//EN" "dtd/kdedbx45.dtd" [
  <!ENTITY kappname "&dolphin;">
  <!ENTITY % Brazilian-Portuguese "INCLUDE">
]>
<book id="dolphin" lang="&language;">
<chapter id="intro"><title>Introdução</title>
<para>O &kappname; é o gerenciador de arquivos padrão do &kde;.</para>
<screen>dolphin --split</screen>
<para>Clique em um item com o &LMB;<indexterm><primary>clique</primary></indexterm> para abri-lo.</para>
<para>Pressione &Fn; para começar.</para>
<para>Digite <programlisting>ls -l</programlisting> no terminal.</para>
</chapter>
<chapter id="views"><title>Modos de exibição</title>
<para>A área de exibição mostra os arquivos da pasta.</para>
</chapter>
</book>
"""


def make_tree(root: Path) -> tuple[Path, Path]:
    custom = root / kde_docbook.CUSTOMIZATION
    (custom / "entities").mkdir(parents=True)
    (custom / "entities" / "general.entities").write_text(GENERAL, encoding="utf-8")
    for language, text in USER.items():
        (custom / language).mkdir()
        (custom / language / "user.entities").write_text(text, encoding="utf-8")
    for folder, text in (("en", EN), ("pt_BR", PT)):
        handbook = root / kde_docbook.DOC_ROOT / folder / "dolphin"
        handbook.mkdir(parents=True)
        (handbook / "index.docbook").write_text(text, encoding="utf-8")
    return root, custom


def test_sections_pair_block_by_block_with_entities_expanded(tmp_path: Path) -> None:
    root, custom = make_tree(tmp_path)
    tables = {folder: kde_docbook.entity_table(custom, language) for folder, language in kde_docbook.LANGUAGES.items()}
    stats: Counter[str] = Counter()
    pairs = list(kde_docbook.handbook_pairs(root, tables, stats))
    assert pairs == [
        ("Introduction", "Introdução"),
        ("Dolphin is the default file manager of KDE.", "O Dolphin é o gerenciador de arquivos padrão do KDE."),
        # after the command block, in its place; the index term left out; each language's own entity
        ("Click an item with the left mouse button to open it.",
         "Clique em um item com o botão esquerdo do mouse para abri-lo."),
        # "Press &Fn; ...": an entity neither table knows, so not paired; nor a paragraph holding code
    ]
    # the "views" chapter has a paragraph more in English: an older translation, left out whole
    assert stats == {"documents": 1, "sections": 1, "sections_misaligned": 1}


def test_entities_expand_through_each_other_and_xml_ones_stay() -> None:
    assert kde_docbook.expand("&a; &b; &amp; &c;", {"a": "&b;!", "b": "B"}) == f"B! B &amp; {kde_docbook.UNKNOWN}"


def test_a_later_train_only_source_leaves_every_held_out_split_as_it_was() -> None:
    from model.data.build import join_train_only
    from model.data.pairs import Pair
    from model.data.split import source_key, split_by_source

    first = [Pair(f"Sentence number {i} is here to stay", f"Frase número {i} fica aqui", "gettext", "p")
             for i in range(60)]
    splits = split_by_source(first, {"dev": 10, "test": 10}, seed=7)
    mallard = [Pair(f"Open the help page number {i} now", f"Abra a página de ajuda número {i} agora", "mallard", "p")
               for i in range(40)]
    prose_en = [p.en for p in join_train_only(splits, {"mallard": mallard}, 5, 3, 7)[0]["prose"]]
    kde = [Pair(f"Click the button number {i} twice", f"Clique duas vezes no botão número {i}", "kde", "p")
           for i in range(30)]
    kde.append(Pair(prose_en[0], "Uma tradução do manual", "kde", "p"))  # would put a prose sentence in train
    out, extra = join_train_only(splits, {"mallard": mallard, "kde": kde}, 5, 3, 7)
    assert [p.en for p in out["prose"]] == prose_en
    assert out["dev"] == splits["dev"] and out["test"] == splits["test"]
    assert not {source_key(p.en) for p in out["prose"]} & {source_key(p.en) for p in out["train"]}
    assert sum(p.source == "kde" for p in out["train"]) == 30 and extra == 71
