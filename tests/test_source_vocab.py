"""`tolk extend-source-vocab`: old pieces keep their ids and embeddings, new ones are the mean of what they were cut
into, a sentence cut as before translates as before, and training starts from the copy and exports it whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from model import checkpoint, source_vocab
from model.search import greedy
from server.cli import main as tolk
from tests.helpers import TRAIN_COMMON, trained_copy, write_text


@pytest.fixture(scope="module")
def extended_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("extended")
    out = tmp / "model"
    assert tolk(["extend-source-vocab", str(tiny_model_dir), str(out), "--text", str(write_text(tmp / "pt.txt")),
                 "--vocab-size", "60", "--pieces", "40"]) == 0
    return out


def test_old_pieces_keep_their_ids_and_new_ones_follow(tiny_model_dir: Path, extended_dir: Path) -> None:
    old = spm.SentencePieceProcessor(model_file=str(tiny_model_dir / "source.spm"))
    new = spm.SentencePieceProcessor(model_file=str(extended_dir / "source.spm"))
    V = old.get_piece_size()
    assert V < new.get_piece_size() <= V + 40
    assert [new.id_to_piece(i) for i in range(V)] == [old.id_to_piece(i) for i in range(V)]
    assert len(new.encode("praia paisagem")) < len(old.encode("praia paisagem"))
    target = (extended_dir / "target.spm").read_bytes()
    assert target == (tiny_model_dir / "target.spm").read_bytes()


def test_the_copy_embeds_new_pieces_as_the_mean_of_their_old_cut(tiny_model_dir: Path, extended_dir: Path) -> None:
    before = checkpoint.load(tiny_model_dir, device="cpu", keep_modules=True).model
    after = checkpoint.load(extended_dir, device="cpu", keep_modules=True).model
    assert not after.cfg.share_embeddings and after.cfg.tgt_vocab_size == before.cfg.tgt_vocab_size
    old_table, new_table = before.src_embed.weight, after.src_embed.weight
    V = old_table.shape[0]
    torch.testing.assert_close(new_table[:V], old_table, rtol=0, atol=0)
    torch.testing.assert_close(after.tgt_embed.weight, before.tgt_embed.weight, rtol=0, atol=0)
    assert after.out_proj.weight.data_ptr() == after.tgt_embed.weight.data_ptr()  # still tied on the target side
    new = spm.SentencePieceProcessor(model_file=str(extended_dir / "source.spm"))
    literal = source_vocab.literal_processor(source_vocab.read_proto(tiny_model_dir / "source.spm"))
    for i in (V, new.get_piece_size() - 1):
        cut = literal.encode(new.id_to_piece(i).replace("\u2581", " "))
        assert len(cut) > 1
        torch.testing.assert_close(new_table[i], old_table[cut].mean(dim=0))


def test_a_sentence_cut_as_before_translates_as_before(tiny_model_dir: Path, extended_dir: Path) -> None:
    before = checkpoint.load(tiny_model_dir, device="cpu")
    after = checkpoint.load(extended_dir, device="cpu")
    from tests.tiny import corpus_lines

    # the new pieces compete with the old ones, so some old text is cut anew too: compare the text cut as before
    sources = [before.tokenizer.encode(t) for t in corpus_lines(200, seed=7)
               if before.tokenizer.encode(t) == after.tokenizer.encode(t)]
    assert len(sources) >= 10
    assert greedy(after.net, sources, 16) == greedy(before.net, sources, 16)
    changed = after.tokenizer.encode("Praia paisagem domingo.")
    assert changed != before.tokenizer.encode("Praia paisagem domingo.")
    assert max(changed) >= before.model.cfg.src_vocab_size


def test_a_run_starts_from_the_copy_and_exports_both_vocabularies(tmp_path: Path) -> None:
    """The copy of a model trained by `tolk train` seeds a run with --source-spm; at learning rate 0 the run's
    export is the copy again: the same weights, the same two vocabularies."""
    corpus, ext = trained_copy(tmp_path)
    common = ("--corpus", str(corpus), *TRAIN_COMMON)
    second = tmp_path / "second"
    vocab = ("--spm", str(ext / "target.spm"), "--source-spm", str(ext / "source.spm"))
    with pytest.raises(ValueError, match="source.spm is not the run.s vocabulary .* pass it as --source-spm"):
        tolk(["train", *common, "--run", str(tmp_path / "wrong"), "--spm", str(ext / "target.spm"), "--init",
              str(ext), "--max-steps", "1"])
    assert tolk(["train", *common, *vocab, "--run", str(second), "--init", str(ext), "--lr", "0", "--max-steps", "1",
                 "--save-every", "1"]) == 0
    # exported without the flags: the run keeps its own two vocabularies
    assert tolk(["train", *common, "--run", str(second), "--export", str(tmp_path / "again"), "--average", "1"]) == 0
    for name in ("source.spm", "target.spm"):
        assert (tmp_path / "again" / name).read_bytes() == (ext / name).read_bytes()
    a = checkpoint.load(ext, device="cpu", keep_modules=True).model.state_dict()
    b = checkpoint.load(tmp_path / "again", device="cpu", keep_modules=True).model.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], msg=name)
