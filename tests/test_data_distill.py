"""`tolk data distill`: WordNet's examples and definitions, fortune-mod's cookies and Jane Austen's novels read from the
packages' own file formats, held-out sentences kept out, translations resumed rather than redone, and the pairs
cleaned as the corpus's are, in either direction."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import pytest

from model.data import distill
from model.data.sources import austen, fortunes, novels, wordnet_examples
from model.data.variety import european_form

# Lines as `data.verb` of wordnet-base writes them: a licence header indented by two spaces, then one synset a
# line, its gloss after the bar with the examples quoted.
DATA_VERB = """\
  1 This software and database is being provided to you, the LICENSEE, by "Princeton University"
00001740 29 v 04 breathe 0 | draw air; "I can breathe better when the air is clean"; "The patient is breathing"
00002084 29 v 01 respire 0 | undergo the biomedical process; "This archaebacterium respires"
00002325 29 v 01 sleep 0 | be asleep; "%s the night"; "sleep"; "I forgot my keys at home."; "The baby sleeps all night"
00002500 29 v 01 nap 0 | sleep briefly; "The baby sleeps all night"; "she napped after lunch"
"""


def make_wordnet(root: Path) -> Path:
    data = root / wordnet_examples.DATA_ROOT
    data.mkdir(parents=True)
    (data / "data.verb").write_text(DATA_VERB, encoding="utf-8")
    for name in ("data.noun", "data.adj", "data.adv"):
        (data / name).write_text("", encoding="utf-8")
    return root


def test_examples_are_the_quoted_sentences_of_the_glosses_once_each(tmp_path: Path) -> None:
    got = list(wordnet_examples.examples(make_wordnet(tmp_path)))
    # not the licence header's quote, not a two-word example, not a frame with %s, not a one-word one; a repeat once
    assert got == ["I can breathe better when the air is clean", "The patient is breathing",
                   "This archaebacterium respires", "I forgot my keys at home.", "The baby sleeps all night",
                   "she napped after lunch"]


def test_held_out_sentences_are_not_translated(tmp_path: Path) -> None:
    everyday = tmp_path / "everyday.en"
    everyday.write_text("i forgot my KEYS at home\nThe weather is nice today.\n", encoding="utf-8")
    held = distill.held_out_keys([everyday, tmp_path / "missing.en"])
    sentences, dropped = distill.sentences_to_translate(wordnet_examples.examples(make_wordnet(tmp_path / "wn")), held)
    assert dropped == 1
    assert "I forgot my keys at home." not in sentences and len(sentences) == 5


def test_translations_resume_from_the_work_file(tmp_path: Path) -> None:
    calls: list[str] = []

    def translate(text: str) -> str:
        calls.append(text)
        return f"pt {text}\n(two lines)"

    done_file = tmp_path / "done.tsv"
    first = distill.translate_resumably(["one two three", "four five six"], done_file, translate, threads=2)
    assert sorted(calls) == ["four five six", "one two three"]
    assert first["one two three"] == "pt one two three (two lines)"  # one line, whatever the teacher wrote
    calls.clear()
    again = distill.translate_resumably(["one two three", "four five six", "seven eight nine"], done_file,
                                        translate, threads=2)
    assert calls == ["seven eight nine"]
    assert {k: again[k] for k in first} == first


def test_pairs_are_cleaned_as_the_corpus_is() -> None:
    sentences = ["The patient is breathing", "This archaebacterium respires", "she napped after lunch"]
    done = {"The patient is breathing": "O paciente está respirando",
            "This archaebacterium respires": "This archaebacterium respires",  # the teacher gave up: untranslated
            "she napped after lunch": "ela cochilou depois do almoço"}
    kept, rejected = distill.clean_pairs(sentences, done)
    assert [(p.en, p.pt, p.source) for p in kept] == [
        ("The patient is breathing", "O paciente está respirando", "wordnet"),
        ("she napped after lunch", "ela cochilou depois do almoço", "wordnet")]
    assert rejected == {"identical": 1}


def test_the_teachers_european_portuguese_is_left_out() -> None:
    """The en-pt teacher writes both varieties; Portugal's words, spellings and progressive leave, Brazil's stay,
    and a human Portuguese source is not second-guessed."""
    done = {"The train was late.": "O comboio atrasou-se.",
            "It has been raining all day.": "Tem estado a chover o dia todo.",
            "He is aware of everything.": "Ele está a par de tudo.",  # "a par": not an infinitive
            "In fact, it was a great match.": "De facto, foi um grande jogo.",
            "We had breakfast at eight.": "Tomamos café da manhã às oito."}
    kept, rejected = distill.clean_pairs(list(done), done)
    assert [p.en for p in kept] == ["He is aware of everything.", "We had breakfast at eight."]
    assert rejected == {"european": 3}
    human = {"Ela está a chegar.": "She is arriving."}  # a pt source: its Portuguese is the human side
    kept, rejected = distill.clean_pairs(list(human), human, distill.SOURCES["fortunes-br"])
    assert len(kept) == 1 and rejected == {}
    assert european_form("O bebé dorme no sofá.") == "bebé" and european_form("O bebê dorme no sofá.") is None


def test_portuguese_sources_are_the_portuguese_side_of_their_pairs() -> None:
    done = {"Eu esqueci minhas chaves em casa.": "I forgot my keys at home."}
    kept, _ = distill.clean_pairs(list(done), done, distill.SOURCES["fortunes-br"])
    assert [(p.en, p.pt) for p in kept] == [("I forgot my keys at home.", "Eu esqueci minhas chaves em casa.")]
    assert distill.SOURCES["fortunes-br"].pair == "pt-en" and distill.SOURCES["fortunes"].pair == "en-pt"


def test_definitions_are_the_glosses_before_their_examples() -> None:
    lines = DATA_VERB.splitlines()
    assert wordnet_examples.gloss_definitions(lines[0]) == []  # the licence header
    assert wordnet_examples.gloss_definitions(lines[1]) == ["draw air"]
    assert wordnet_examples.gloss_definitions(
        "00002 03 n 01 milk 0 | a white nutritious liquid secreted by mammals; dairy milk; \"milk is good\"") == [
        "a white nutritious liquid secreted by mammals", "dairy milk"]


# A cookie file as fortune-mod's packages write it: fortunes between lines of one %, attributions after "--",
# verse and dialogue indented.
COOKIES = """\
The weather is nice today.  Let's go to the beach!
		-- Someone, somewhere
%
Never put off till tomorrow what you can do the day after tomorrow.
It saves a whole day.
%
Roses are red,
	violets are blue.
%
#include <stdio.h> is not a sentence.
%
Q:	Why did the chicken cross the road?
A:	To get to the other side.
%
"""


def test_fortunes_are_cut_into_their_prose_sentences(tmp_path: Path) -> None:
    data = tmp_path / fortunes.DATA_ROOT
    data.mkdir(parents=True)
    (data / "wisdom").write_text(COOKIES + "The weather is nice today.\n", encoding="utf-8")
    (data / "wisdom.dat").write_bytes(b"\x00\x02")  # the index beside each file
    (data / "ascii-art").write_text("Pictures are not sentences here.\n", encoding="utf-8")
    assert list(fortunes.sentences(tmp_path)) == [
        "The weather is nice today.", "Let's go to the beach!",
        "Never put off till tomorrow what you can do the day after tomorrow.", "It saves a whole day."]


# Two novels as r-cran-janeaustenr holds them: one printed line an element, paragraphs between empty lines,
# Project Gutenberg's _italics_, titles with a stop inside sentences, dialogue cut by the sentence split.
PERSUASION = ["Persuasion", "", "", "Chapter 1", "", "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man",
              "who never took up any book but the Baronetage.", "", '"I do _not_ know where the error lies.',
              'Mrs. Clay will come with us." She smiled at him.', "", "Finis"]
EMMA = ["EMMA", "", "By Jane Austen", "", "Mr. Knightley, a sensible man, was a very old and intimate friend.",
        "It will all end right.", ""]


def write_lazyload(data: Path, objects: dict[str, list[str]]) -> None:
    """R's lazy-load database as R writes it for a package's data, written with rdata's own serializer: each object a
    4-byte big-endian length and a zlib stream in `Rdata.rdb`, and its offset and length in the RDS `Rdata.rdx`."""
    rdata = pytest.importorskip("rdata")
    np = pytest.importorskip("numpy")
    from rdata.unparser import unparse_data

    data.mkdir(parents=True)
    blob, variables = b"", {}
    for name, lines in objects.items():
        raw = unparse_data(rdata.conversion.convert_python_to_r_data(np.array(lines)))
        record = struct.pack(">I", len(raw)) + zlib.compress(raw)
        variables[name] = np.array([len(blob), len(record)], dtype=np.int32)
        blob += record
    (data / "Rdata.rdb").write_bytes(blob)
    rdata.write_rds(data / "Rdata.rdx", {"variables": variables, "references": {}, "compressed": True})


def test_austen_novels_are_read_from_the_lazyload_database_and_cut_into_sentences(tmp_path: Path) -> None:
    write_lazyload(tmp_path / austen.DATA_ROOT, {"persuasion": PERSUASION, "emma": EMMA})
    assert {name: list(lines) for name, lines in austen.read_lazyload(tmp_path / austen.DATA_ROOT).items()} == {
        "persuasion": PERSUASION, "emma": EMMA}
    assert list(austen.sentences(tmp_path)) == [
        "Mr. Knightley, a sensible man, was a very old and intimate friend.", "It will all end right.",  # emma first
        "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who never took up any book but the "
        "Baronetage.",
        "I do not know where the error lies.", "Mrs. Clay will come with us.", "She smiled at him."]
    assert "austen" in distill.SOURCES and distill.SOURCES["austen"].pair == "en-pt"


# tidytext's books as its data frame holds them (one printed line a row, titled), and Moby Dick as tokenizers
# holds it: one string, Windows line ends, Project Gutenberg's header and licence around the text.
BOOKS = [("The War of the Worlds", "The War of the Worlds"), ("The War of the Worlds", "by H. G. Wells [1898]"),
         ("The War of the Worlds", ""), ("The War of the Worlds", "No one would have believed in the last years"),
         ("The War of the Worlds", "of the nineteenth century that this world was being watched."),
         ("Pride and Prejudice", "It is a truth universally acknowledged, that a single man must be in want."),
         ("Twenty Thousand Leagues under the Sea", "M. Aronnax, you are a learned man. Come with me!"),
         ("Twenty Thousand Leagues under the Sea", None)]
MOBY_DICK = ("The Project Gutenberg EBook of Moby Dick; or The Whale, by Herman Melville\r\n\r\nThis eBook is for "
             "the use of anyone anywhere at no cost.\r\n\r\n*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***"
             "\r\n\r\nCall me Ishmael. Some years ago, never mind how long\r\nprecisely, I thought I would sail "
             "about a little.\r\n\r\n*** END OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***\r\n\r\nYou may "
             "copy it, give it away or re-use it.\r\n")


def test_novels_are_read_from_tidytext_and_tokenizers_without_austen_or_gutenberg_text(tmp_path: Path) -> None:
    rdata = pytest.importorskip("rdata")
    pd = pytest.importorskip("pandas")
    tidytext, tokenizers = tmp_path / "tidytext", tmp_path / "tokenizers"
    (tidytext / novels.BOOKS).parent.mkdir(parents=True)
    # strings held by Python, as rdata writes them (with pyarrow installed pandas would hold them in Arrow arrays,
    # which rdata's writer does not take)
    text = pd.StringDtype("python")
    frame = pd.DataFrame({"gutenberg_id": [36] * len(BOOKS), "text": pd.array([t for _, t in BOOKS], dtype=text),
                          "title": pd.array([title for title, _ in BOOKS], dtype=text)})
    rdata.write_rda(tidytext / novels.BOOKS, {"books": frame})
    write_lazyload(tokenizers / novels.MOBY_DICK, {"mobydick": [MOBY_DICK]})
    assert list(novels.sentences(tidytext)) == [
        "No one would have believed in the last years of the nineteenth century that this world was being watched.",
        "M. Aronnax, you are a learned man.", "Come with me!"]  # in title order; Pride and Prejudice is austen's
    assert list(novels.sentences(tokenizers)) == ["Call me Ishmael.",
                                                  "Some years ago, never mind how long precisely, I thought I would "
                                                  "sail about a little."]
    assert distill.SOURCES["novels"].packages == (novels.TIDYTEXT, novels.TOKENIZERS)


def test_a_damaged_lazyload_record_is_an_error_not_a_short_novel(tmp_path: Path) -> None:
    data = tmp_path / austen.DATA_ROOT
    write_lazyload(data, {"emma": EMMA})
    blob = bytearray((data / "Rdata.rdb").read_bytes())
    blob[0:4] = struct.pack(">I", struct.unpack(">I", bytes(blob[0:4]))[0] + 1)  # the length no longer matches
    (data / "Rdata.rdb").write_bytes(bytes(blob))
    with pytest.raises(ValueError, match="emma"):
        austen.read_lazyload(data)
