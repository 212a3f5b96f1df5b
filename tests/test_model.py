"""The model core: cached decoding equals recomputation, batching is invisible, search behaves."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

from model import checkpoint
from model.beams import top_k
from model.decode import DecodeBatch
from model.events import FinishEvent, Hypothesis, SentenceKey, TokenEvent
from model.frozen import attend_one, freeze
from model.generation import GenerationConfig
from model.layers import ACTIVATION_FUNCTIONS
from model.projection import Projection
from model.search import admissible, argmax, beam_search, generate, greedy, release_batch, sample, step
from model.transformer import Transformer
from tests.helpers import device_way_against_general_way, stepped_logits
from tests.tiny import tiny_config, tiny_model

SOURCES = ["Open the file.", "Save changes before closing the settings window.", "Error", "Click here to continue."]


@pytest.fixture(scope="module")
def loaded(tiny_loaded: checkpoint.LoadedModel) -> checkpoint.LoadedModel:
    return tiny_loaded


@pytest.fixture(scope="module")
def sources(loaded: checkpoint.LoadedModel) -> list[list[int]]:
    return [loaded.tokenizer.encode(s) for s in SOURCES]


def greedy_by_recomputation(model: Transformer, src: list[int], max_new: int) -> list[int]:
    """Reference decoder: the whole prefix through the full decoder at every step, no cache."""
    cfg = model.cfg
    out = [cfg.decoder_start_id]
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(torch.tensor([src]), torch.tensor([out]))[0, -1]
            logits[[cfg.pad_id, cfg.bos_id]] = float("-inf")
            token = int(logits.argmax())
            if token == cfg.eos_id:
                break
            out.append(token)
    return out[1:]


@pytest.mark.parametrize(("prepack", "fused"), [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize(("norm", "activation", "rows"), [
    ("post", "swish", 2), ("pre", "gelu", 2), ("post", "relu", 9), ("pre", "relu", 1)])
def test_cached_logits_equal_full_recomputation(norm: str, activation: str, rows: int, prepack: bool,
                                                fused: bool) -> None:
    """Through the fused step (up to its rows) and the operator-by-operator one (with row-wise attention)."""
    model = tiny_model(tiny_config(norm=norm, activation=activation))
    src = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0]] * (rows // 2) + [[20, 2, 0, 0, 0, 0]] * (rows % 2))
    tgt = torch.randint(4, 90, (rows, 5), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = 1
    with torch.no_grad():
        full = model(src, tgt)  # (rows, 5, V) through the modules
    torch.testing.assert_close(stepped_logits(model, src, tgt, prepack, fused), full, atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a torch build without oneDNN")
def test_prepacked_projections_equal_plain_linear_within_rounding() -> None:
    torch.manual_seed(0)
    q, k, v = (nn.Linear(48, 40) for _ in range(3))
    x, residual = torch.randn(5, 48), torch.randn(5, 40)
    with torch.no_grad():
        stacked = torch.cat([F.linear(x, m.weight, m.bias) for m in (q, k, v)], -1)
        packed = Projection([q, k, v])
        assert packed.onednn and not Projection([q, k, v], prepack=False).onednn
        torch.testing.assert_close(packed(x), stacked, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(Projection([q])(x, residual=residual), q(x) + residual, atol=1e-5, rtol=1e-5)
        for name, act in ACTIVATION_FUNCTIONS.items():
            torch.testing.assert_close(Projection([k], name)(x), act(k(x)), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="a torch build without oneDNN")
@pytest.mark.parametrize("shape", [(1, 48), (1, 1, 48)])
def test_one_row_plain_product_equals_the_prepacked_one(shape: tuple[int, ...]) -> None:
    """One row takes the plain GEMM (ONE_ROW_PLAIN_MAX); it must agree with oneDNN's product and with F.linear."""
    torch.manual_seed(0)
    k, v = nn.Linear(48, 40), nn.Linear(48, 24, bias=False)
    x, residual = torch.randn(shape), torch.randn(*shape[:-1], 40)
    with torch.no_grad():
        cases = (([k], None, residual), ([k, v], None, None), ([k], "gelu", None), ([v], "relu", None))
        for linears, act, res in cases:
            proj = Projection(linears, act)
            assert proj.onednn and proj.one_row is not None
            one_row = proj(x, residual=res)
            proj.one_row = None  # the same product through oneDNN
            packed = proj(x, residual=res)
            plain = torch.cat([F.linear(x, m.weight, m.bias) for m in linears], -1)
            plain = ACTIVATION_FUNCTIONS[act](plain) if act else plain
            plain = plain + res if res is not None else plain
            assert one_row.shape == packed.shape == plain.shape
            torch.testing.assert_close(one_row, packed, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(one_row, plain, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["float32", "rows8", "half"])
def test_a_deferred_product_packs_at_its_first_call_and_equals_one_packed_at_once(kind: str) -> None:
    """Projection(defer=True) (`freeze(defer=True)`: a decoding process's load) holds no packed weights until
    `pack` or its first call, then gives the numbers of a product packed when made; released, it never packs."""
    torch.manual_seed(0)
    q, k = nn.Linear(48, 40), nn.Linear(48, 24, bias=False)
    x = torch.randn(5, 48)
    settings = {"rows8": kind == "rows8", "half": kind == "half"}
    with torch.no_grad():
        now = Projection([q, k], "relu", **settings)
        later = Projection([q, k], "relu", defer=True, **settings)
        assert later.pending is not None and later.weight is None and later.rows8 is None and later.half is None
        assert later.per_row == now.per_row == (kind == "rows8")
        assert torch.equal(later(x), now(x)) and later.pending is None
        assert torch.equal(later(x[:1]), now(x[:1]))  # one row: the plain product of float32 weights
        gone = Projection([q, k], "relu", defer=True, **settings)
        gone.release()
        gone.pack()
        assert gone.released and gone.pending is None and gone.rows8 is None and gone.half is None


def test_read_weights_fills_a_model_tensor_by_tensor_and_names_what_does_not_fit(tmp_path: Path) -> None:
    """`checkpoint.read_weights`: float16 files cast as they are copied, a tied table stored once fills both
    parameters, and a file that does not fit is refused before anything is copied, naming the tensors."""
    from safetensors.torch import save_file, save_model

    cfg = tiny_config()
    source = tiny_model(cfg)
    path = tmp_path / "model.safetensors"
    save_model(source.half(), str(path))  # tied tables once
    model = Transformer(cfg)
    checkpoint.read_weights(model, path)
    assert model.out_proj.weight is model.tgt_embed.weight
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor.float()), name
    state = {k: v.float() for k, v in source.state_dict().items() if k != "out_proj.weight"}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bias = "decoder.1.ff.fc2.bias"
    assert bias in state
    for changed, match in (({k: v for k, v in state.items() if k != bias}, f"missing.*{bias}"),
                           (state | {"extra": torch.zeros(2)}, "unexpected.*extra"),
                           (state | {bias: torch.zeros(3)}, f"other shapes.*{bias}")):
        save_file(changed, str(path))
        with pytest.raises(ValueError, match=match):
            checkpoint.read_weights(Transformer(cfg), path)
    save_file(state | {bias: torch.zeros(3)}, str(path))
    with pytest.raises(ValueError):
        checkpoint.read_weights(model, path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())  # nothing copied


@pytest.mark.parametrize("rows", [1, 8])
def test_attention_of_one_query_equals_sdpa(rows: int) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(rows, 4, 1, 16, generator=g)
    k, v = torch.randn(2, rows, 4, 9, 16, generator=g).unbind(0)
    mask = torch.arange(9) < torch.randint(1, 10, (rows, 1, 1, 1), generator=g)
    for m in (None, mask):
        torch.testing.assert_close(attend_one(q, k, v, m), F.scaled_dot_product_attention(q, k, v, attn_mask=m))


@pytest.mark.parametrize("prepack", [True, False])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_packed_encoder_equals_each_source_alone(norm: str, prepack: bool) -> None:
    """The encoder skips padding (model.frozen.Packing): a padded batch's real positions equal each source alone."""
    net = freeze(tiny_model(tiny_config(norm=norm)), prepack=prepack)
    sources = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [20, 2]]
    src = torch.tensor([s + [0] * (6 - len(s)) for s in sources])
    with torch.no_grad():
        memory, mask = net.encode(src)
        cross, cross_mask = net.encode_cross(src)  # (L, 2, B, H, S, Dh)
        assert torch.equal(mask, cross_mask) and torch.equal(mask, src != 0)
        torch.testing.assert_close(cross * mask[None, None, :, None, :, None], net.cross_kv(memory) * mask[
            None, None, :, None, :, None])
        for b, s in enumerate(sources):
            alone, _ = net.encode(torch.tensor([s]))
            torch.testing.assert_close(memory[b, : len(s)], alone[0], atol=1e-5, rtol=1e-5)
            assert not memory[b, len(s):].any()  # padding stays zero: nothing is computed there
            alone_cross, _ = net.encode_cross(torch.tensor([s]))
            torch.testing.assert_close(cross[:, :, b, :, : len(s)], alone_cross[:, :, 0], atol=1e-5, rtol=1e-5)


def test_int8_stacked_projection_equals_the_quantized_modules_exactly() -> None:
    torch.manual_seed(0)
    linears = nn.Sequential(*(nn.Linear(48, n) for n in (40, 40, 24)))
    quantized = list(checkpoint.quantize_int8(linears))
    x = torch.randn(7, 48)
    with torch.no_grad():
        assert torch.equal(Projection(quantized)(x), torch.cat([m(x) for m in quantized], -1))


def test_int8_decode_steps_track_float32() -> None:
    model = tiny_model(tiny_config(activation="gelu"))
    src, tgt = torch.tensor([[5, 6, 7, 8, 9, 2], [10, 11, 2, 0, 0, 0]]), torch.tensor([[1, 12, 13], [1, 16, 17]])
    exact = stepped_logits(model, src, tgt)
    approx = stepped_logits(checkpoint.quantize_int8(model), src, tgt)
    assert (exact.argmax(-1) == approx.argmax(-1)).float().mean() >= 0.8
    assert torch.corrcoef(torch.stack([exact.flatten(), approx.flatten()]))[0, 1] > 0.99


def test_freeze_follows_the_parameters() -> None:
    model = tiny_model()
    src, tgt = torch.tensor([[5, 6, 7, 2]]), torch.tensor([[1, 12, 13]])
    before = stepped_logits(model, src, tgt)
    with torch.no_grad():
        dict(model.named_parameters())["decoder.0.ff.fc2.weight"].mul_(2.0)
        full = model(src, tgt)
    torch.testing.assert_close(stepped_logits(model, src, tgt), full, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(before, full)
    net = freeze(model)
    twin = copy.deepcopy(model)  # a frozen network lives outside the module: the copy builds its own weights
    assert freeze(twin).tgt_table.data_ptr() != net.tgt_table.data_ptr()
    torch.testing.assert_close(stepped_logits(twin, src, tgt), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(("B", "V"), [(3, 8000), (16, 8000), (40, 8000), (2, 58101), (5, 512)])
def test_chunked_argmax_equals_torch_argmax(B: int, V: int) -> None:
    g = torch.Generator().manual_seed(B)
    x = torch.randn(B, V, generator=g)
    x[0, 7] = x[0, V - 9] = x[0].max() + 1  # a tie: the first index wins
    x[1, V - 1] = 50.0  # the maximum in the tail after the last whole chunk
    if B > 2:
        x[2] = float("-inf")  # every token banned
    assert torch.equal(argmax(x), x.argmax(-1))  # numpy's way
    assert torch.equal(argmax(x.double()), x.argmax(-1))  # the chunks' way (float64: not numpy's)


@pytest.mark.parametrize("V", [100, 1000, 1031])
def test_chunked_top_k_equals_torch_top_k(V: int) -> None:
    x = torch.randn(6, V, generator=torch.Generator().manual_seed(V)).log_softmax(-1)
    x[:, [0, 5]] = float("-inf")
    x[1, 700 % V :] += 5.0  # the best tokens in the tail
    for k in (1, 2, 8):
        values, ids = top_k(x, k, chunk=64, min_size=0)  # the chunked path, whatever the width
        expected = x.topk(k, dim=-1)
        assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)


@pytest.mark.parametrize(("k", "V"), [(4, 1000), (3, 5), (2, 2)])
def test_compiled_best_continuations_equal_the_two_top_ks(k: int, V: int) -> None:
    """`best_continuations` (one pass, model/beam_host.py) against the torch way: the 2k best tokens of each beam,
    then the 2k best of score + log-prob among those. First step included: beams other than 0 at -inf."""
    beam_host = pytest.importorskip("model.beam_host", reason="numba")
    g = torch.Generator().manual_seed(k * V)
    logprobs = torch.randn(3 * k + 1, V, generator=g).log_softmax(-1)
    logprobs[:, 0] = float("-inf")  # a banned token
    score = torch.randn(3 * k + 1, generator=g)
    score[[1, 2]] = float("-inf")  # sentence 0 at its first step: only its beam 0 is alive
    rows = torch.arange(3 * k).view(3, k) + torch.tensor([0, 0, 1])[:, None]  # row 3k-1 skipped, row 3k read
    rows[2] = rows[2].flip(0)  # a sentence's beams need not be rows in order
    n = min(2 * k, k * V)
    top, beam = torch.empty(3, n), torch.empty(3, n, dtype=torch.long)
    token = torch.empty(3, n, dtype=torch.long)
    beam_host.best_continuations(logprobs.numpy(), rows.numpy(), score.numpy(), top.numpy(), beam.numpy(),
                                 token.numpy())
    c = min(2 * k, V)
    lp, tok = logprobs.topk(c, dim=-1)
    cand = (score[rows][..., None] + lp[rows]).view(3, k * c)
    expected, ids = cand.topk(n, dim=-1)
    finite = expected.isfinite()
    assert torch.equal(top, expected) and torch.equal(beam[finite], (ids // c)[finite])
    assert torch.equal(token[finite], tok[rows].view(3, k * c).gather(1, ids)[finite])


def test_beam_search_on_the_cpu_gives_the_torch_ways_hypotheses(loaded: checkpoint.LoadedModel,
                                                                  sources: list[list[int]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("model.beam_host", reason="numba")
    import model.beams
    config = GenerationConfig(beam_size=3, num_hypotheses=3, max_new_tokens=16)
    compiled = generate(loaded.net, sources, config)
    monkeypatch.setattr(model.beams, "best_continuations", None)  # the top-ks of the GPU's way, in numpy
    by_torch = generate(loaded.net, sources, config)
    assert [[(h.tokens, h.score) for h in hyps] for hyps in compiled] == \
        [[(h.tokens, h.score) for h in hyps] for hyps in by_torch]


@pytest.mark.parametrize("k", [2, 4])
def test_compiled_beam_choice_equals_advance_beams(k: int) -> None:
    """`choose_beams` against `_advance_beams` on the same candidates, end-of-sentence at every rank in turn: the
    hypotheses it ends (only within the first k) and the k continuations, in order."""
    beam_host = pytest.importorskip("model.beam_host", reason="numba")
    from model.beams import _advance_beams, _take
    from model.decode import Sequence
    V, eos, m = 30, 2, 2 * k + 1
    g = torch.Generator().manual_seed(k)
    for trial in range(2 * k + 2):
        logprobs = torch.randn(m * k, V, generator=g).log_softmax(-1)
        score = torch.randn(m * k, generator=g)
        for j in range(m):  # sentence j's end-of-sentence among its best candidates, at a rank that moves
            logprobs[j * k + (j + trial) % k, eos] = 5.0 - ((j + trial) % (2 * k + 1))
        rows = torch.arange(m * k).view(m, k)
        n = 2 * k
        top, beam, token = np.empty((m, n), np.float32), np.empty((m, n), np.int64), np.empty((m, n), np.int64)
        chosen, ended = np.empty((m, k, 3)), np.empty((m, k + 1, 2))
        assert beam_host.choose_beams(logprobs.numpy(), rows.numpy(), score.numpy(), eos, top, beam, token, chosen,
                                      ended) == k
        config = GenerationConfig(beam_size=k, num_hypotheses=k)
        for j in range(m):
            history = [[10 + b] * 3 for b in range(k)]
            listed = Sequence((0, j), config, 5, list(range(k)), 20, [list(h) for h in history], [0.0] * k)
            candidates = list(zip(beam[j].tolist(), token[j].tolist(), strict=True))
            picks = _advance_beams(listed, top[j].tolist(), candidates, eos, None)
            taken = Sequence((0, j), config, 5, list(range(k)), 20, [list(h) for h in history], [0.0] * k)
            _take(taken, chosen[j].tolist(), ended[j].tolist(), None)
            assert [(int(b), int(t), s) for b, t, s in chosen[j].tolist()] == picks
            assert (taken.tokens, taken.scores, taken.hyps) == (listed.tokens, listed.scores, listed.hyps)
            assert int(ended[j, 0, 0]) == len(listed.hyps)


def test_compiled_beam_moves_give_the_listed_ways_hypotheses(loaded: checkpoint.LoadedModel,
                                                              sources: list[list[int]],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """`choose_beams` and `move_beams` (the choice and the rows' moves compiled) against the same candidates chosen
    and moved from Python lists (`_advance_beams`, `DecodeBatch.reorder`): hypotheses, scores and alignments."""
    pytest.importorskip("model.beam_host", reason="numba")
    import model.beams
    configs = [GenerationConfig(beam_size=3, num_hypotheses=3, max_new_tokens=16, alignment=True),
               GenerationConfig(beam_size=4, num_hypotheses=2, max_new_tokens=12, length_penalty=0.6)]
    for config in configs:
        monkeypatch.undo()
        compiled = generate(loaded.net, sources, config, max_rows=2 * config.beam_size)  # rows reused as they free
        monkeypatch.setattr(model.beams, "move_beams", None)
        listed = generate(loaded.net, sources, config, max_rows=2 * config.beam_size)
        assert [[(h.tokens, h.score, h.alignment) for h in hyps] for hyps in compiled] == \
            [[(h.tokens, h.score, h.alignment) for h in hyps] for hyps in listed]


def test_short_beam_step_gives_the_general_ways_hypotheses(loaded: checkpoint.LoadedModel,
                                                             sources: list[list[int]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`short_beam_step` (the fused step, the choice, the moves and the record in compiled calls) against the
    general way (`DecodeBatch.forward`, `_log_probs`, `beam_step`, `record`): the same hypotheses and scores bit
    for bit, with rows reused as sentences finish, end of sentence held back (min_new_tokens) and sentences
    running out of length; and mixed batches (a greedy row beside the beams) still take the general way."""
    pytest.importorskip("model.beam_host", reason="numba")
    import model.beams
    import model.search
    if loaded.net.fused is None:
        pytest.skip("no fused step")
    taken = []

    def counted(batch: DecodeBatch, seqs: list) -> bool:
        went = model.beams.short_beam_step(batch, seqs)
        taken.append(went)
        return went

    monkeypatch.setattr(model.search, "short_beam_step", counted)
    # steps one by one: the loop of several (`beam_steps`, tests/test_fused_step.py) would take them instead
    monkeypatch.setattr(model.search, "beam_steps", lambda *args: None)
    configs = [GenerationConfig(beam_size=3, num_hypotheses=3, max_new_tokens=16),
               GenerationConfig(beam_size=4, num_hypotheses=2, max_new_tokens=6, length_penalty=0.6,
                                min_new_tokens=3),
               [GenerationConfig(beam_size=2, max_new_tokens=12)] * (len(sources) - 1)
               + [GenerationConfig(max_new_tokens=3)]]
    for config in configs:
        rows = 2 * 4
        taken.clear()
        short = generate(loaded.net, sources, config, max_rows=rows)
        assert any(taken)
        mixed = isinstance(config, list)
        assert all(taken) != mixed  # while the greedy row decodes, its batch's steps go the general way
        monkeypatch.setattr(model.search, "short_beam_step", lambda batch, seqs: False)
        general = generate(loaded.net, sources, config, max_rows=rows)
        monkeypatch.setattr(model.search, "short_beam_step", counted)
        assert [[(h.tokens, h.score, h.finish_reason) for h in hyps] for hyps in short] == \
            [[(h.tokens, h.score, h.finish_reason) for h in hyps] for hyps in general]


def test_device_beam_step_gives_the_general_ways_hypotheses(loaded: checkpoint.LoadedModel,
                                                            sources: list[list[int]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    device_way_against_general_way(loaded.net, sources, monkeypatch)


def test_greedy_equals_recomputation(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    cached = greedy(loaded.net, sources, max_new_tokens=20)
    reference = [greedy_by_recomputation(loaded.model, s, 20) for s in sources]
    assert cached == reference
    assert any(len(c) < 20 for c in cached), "the tiny model should end some sentences with eos"


def test_padded_batch_equals_each_alone(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    config = GenerationConfig(max_new_tokens=20)
    together = generate(loaded.net, sources, config)
    alone = [generate(loaded.net, [s], config)[0] for s in sources]
    assert [h[0].tokens for h in together] == [h[0].tokens for h in alone]
    for a, b in zip(together, alone, strict=True):
        assert a[0].score == pytest.approx(b[0].score, abs=1e-4)


def _hypotheses(results: list[list[Hypothesis]]) -> list[list[tuple[list[int], float]]]:
    return [[(h.tokens, h.score) for h in hyps] for hyps in results]


def test_generate_in_its_kept_batch_decodes_as_in_a_new_one(loaded: checkpoint.LoadedModel,
                                                           sources: list[list[int]]) -> None:
    """Calls of other settings, sizes and source lengths one after another in the batch `generate` keeps between
    calls (`search.kept_batch`) decode as each in a batch of its own; the batch is kept where it fits."""
    net = loaded.net
    calls = [(sources[:1], GenerationConfig(beam_size=4, max_new_tokens=12), 4),
             (sources[1:3], GenerationConfig(max_new_tokens=12), 4),
             (sources[:3], GenerationConfig(do_sample=True, seed=3, max_new_tokens=12, scores=True), 4),
             ([(sources[1] * 8)[:100]], GenerationConfig(beam_size=2, num_hypotheses=2, max_new_tokens=12), 4),
             (sources, GenerationConfig(beam_size=2, max_new_tokens=10), 6),
             (sources[:1], GenerationConfig(beam_size=4, max_new_tokens=12), 4)]
    release_batch(net)
    kept, fresh, batches = [], [], []
    for src, config, rows in calls:
        kept.append(_hypotheses(generate(net, src, config, max_rows=rows)))
        batches.append(net.idle_batch)
        new = DecodeBatch(net, rows, max(len(s) for s in src), config.max_new_tokens)
        fresh.append(_hypotheses(generate(net, src, config, max_rows=rows, batch=new)))
    assert kept == fresh
    assert batches[1] is batches[0] and batches[2] is batches[0]  # the same rows and length: kept
    assert batches[3] is not batches[2]  # a source longer than the batch holds: made anew (as here)
    assert batches[4] is not batches[3] and batches[5] is not batches[4]  # other rows
    assert batches[3].cache.max_src >= 100 and batches[4].cache.rows == 6 and batches[5].cache.rows == 4


def test_rows_admitted_at_different_steps_decode_as_alone(
    loaded: checkpoint.LoadedModel, sources: list[list[int]]
) -> None:
    greedy_cfg = GenerationConfig(max_new_tokens=20)
    beam_cfg = GenerationConfig(beam_size=3, max_new_tokens=20)
    plan = [(0, 0, greedy_cfg), (1, 2, beam_cfg), (3, 2, greedy_cfg), (5, 1, greedy_cfg), (7, 3, beam_cfg)]
    batch = DecodeBatch(loaded.net, rows=8, max_src=32, max_tgt=24)
    results: dict[int, list[int]] = {}
    streamed: dict[int, list[int]] = {}
    turn = 0
    pending = list(enumerate(plan))
    while len(results) < len(plan):
        while pending and pending[0][1][0] <= turn and pending[0][1][2].beam_size <= batch.free_rows:
            k, (_, i, c) = pending.pop(0)  # joins mid-flight, in rows others have just freed
            batch.admit([((k, 0), sources[i], c)])
        for event in step(batch):
            if isinstance(event, TokenEvent):
                streamed.setdefault(event.request, []).append(event.token)
            elif isinstance(event, FinishEvent):
                results[event.request] = event.hypotheses[0].tokens
        turn += 1
    assert batch.n == 0 and batch.cache.t_hi == 0
    for k, (_, i, c) in enumerate(plan):
        assert results[k] == generate(loaded.net, [sources[i]], c)[0][0].tokens, f"sequence {k}"
        if c.beam_size == 1:
            assert streamed.get(k, []) == results[k]


def test_cancel_frees_rows_and_leaves_others_intact(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    config = GenerationConfig(max_new_tokens=20)
    a, b, c = (1, 0), (1, 1), (2, 0)
    batch = DecodeBatch(loaded.net, rows=4, max_src=32, max_tgt=24)
    batch.admit([(a, sources[0], config), (b, sources[1], GenerationConfig(beam_size=2, max_new_tokens=20)),
                 (c, sources[3], config)])
    step(batch)
    assert batch.free_rows == 0
    assert batch.cancel(b) and not batch.cancel(b)
    assert batch.free_rows == 2
    out: dict[SentenceKey, list[int]] = {a: [], c: []}
    first = {a: generate(loaded.net, [sources[0]], config)[0][0].tokens[:1]}
    while len(batch):
        for event in step(batch):
            if isinstance(event, FinishEvent):
                out[event.key] = event.hypotheses[0].tokens
    assert out[a] == generate(loaded.net, [sources[0]], config)[0][0].tokens
    assert out[c] == generate(loaded.net, [sources[3]], config)[0][0].tokens
    assert out[a][:1] == first[a]


def test_beam_one_equals_greedy(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    beams = beam_search(loaded.net, sources, beam_size=1, max_new_tokens=20)
    assert [h[0].tokens for h in beams] == greedy(loaded.net, sources, max_new_tokens=20)


def test_nbest_is_sorted_and_distinct(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    for hyps in beam_search(loaded.net, sources, beam_size=4, num_hypotheses=4, max_new_tokens=20):
        assert len(hyps) == 4
        scores = [h.score for h in hyps]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 4


def test_beam_search_finds_at_least_the_greedy_score(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    config = GenerationConfig(beam_size=4, length_penalty=0.0, max_new_tokens=20)
    greedy_hyps = generate(loaded.net, sources, GenerationConfig(max_new_tokens=20))
    for beam, g in zip(generate(loaded.net, sources, config), greedy_hyps, strict=True):
        if g[0].finish_reason == "eos":
            assert beam[0].score >= g[0].score - 1e-4


def test_sampling_is_reproducible_by_seed_and_batch_independent(
    loaded: checkpoint.LoadedModel, sources: list[list[int]]
) -> None:
    a = sample(loaded.net, sources, seed=7, max_new_tokens=12)
    b = sample(loaded.net, sources, seed=7, max_new_tokens=12)
    alone = sample(loaded.net, sources[1:2], seed=7, max_new_tokens=12)
    other = sample(loaded.net, sources, seed=8, max_new_tokens=12)
    assert a == b
    assert alone[0] == a[1]
    assert other != a


def test_sampling_respects_top_k_one(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    sampled = sample(loaded.net, sources, seed=3, top_k=1, temperature=2.0, max_new_tokens=12)
    assert sampled == greedy(loaded.net, sources, max_new_tokens=12)


def test_rows_with_different_settings_share_a_batch(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    configs = [
        GenerationConfig(max_new_tokens=20),
        GenerationConfig(beam_size=4, num_hypotheses=2, max_new_tokens=20),
        GenerationConfig(do_sample=True, seed=5, top_p=0.9, temperature=0.7, max_new_tokens=20),
        GenerationConfig(repetition_penalty=1.5, no_repeat_ngram_size=2, min_new_tokens=3, max_new_tokens=20),
    ]
    mixed = generate(loaded.net, sources, configs)
    for src, config, hyps in zip(sources, configs, mixed, strict=True):
        assert [h.tokens for h in hyps] == [h.tokens for h in generate(loaded.net, [src], config)[0]]


def test_length_limits_and_no_repeat_ngram(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    short = generate(loaded.net, sources, GenerationConfig(max_new_tokens=3))
    assert all(len(h[0].tokens) <= 3 for h in short)
    assert any(h[0].finish_reason == "length" for h in short)
    long = generate(loaded.net, sources, GenerationConfig(min_new_tokens=15, max_new_tokens=20))
    assert all(len(h[0].tokens) >= 15 for h in long)
    for hyps in generate(loaded.net, sources, GenerationConfig(no_repeat_ngram_size=2, max_new_tokens=20)):
        toks = hyps[0].tokens
        bigrams = list(zip(toks, toks[1:], strict=False))
        assert len(bigrams) == len(set(bigrams))


def test_beams_keep_their_own_history_when_rows_are_reordered(loaded: checkpoint.LoadedModel,
                                                               sources: list[list[int]]) -> None:
    """The n-gram ban reads each row's history: after a beam moves to another row, that row must hold the beam's
    tokens, or the ban looks at another hypothesis and lets a repeat through."""
    config = GenerationConfig(beam_size=4, num_hypotheses=4, no_repeat_ngram_size=2, min_new_tokens=16,
                              max_new_tokens=24)
    for hyps in generate(loaded.net, sources, config):
        for h in hyps:
            bigrams = list(zip(h.tokens, h.tokens[1:], strict=False))
            assert len(bigrams) == len(set(bigrams)), h.tokens


def test_repetition_penalty_changes_only_seen_tokens() -> None:
    from model.logits import repetition_penalty

    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0], [1.0, 1.0, 1.0, 1.0]])
    history = torch.tensor([[3, 1, 0], [2, 2, 0]])
    repetition_penalty(logits, history, torch.tensor([2, 1]), torch.tensor([2.0, 4.0]))
    assert logits.tolist() == [[2.0, -2.0, 0.5, 1.5], [1.0, 1.0, 0.25, 1.0]]


@pytest.mark.parametrize(
    "field,value",
    [("beam_size", 0), ("beam_size", 100), ("temperature", 0.0), ("temperature", -1.0), ("temperature", 1e-308),
     ("repetition_penalty", 1e-308), ("top_p", 1.5),
     ("top_p", 0.0), ("top_k", -1), ("max_new_tokens", 0), ("max_new_tokens", 10**6), ("repetition_penalty", 0.0),
     ("no_repeat_ngram_size", -2), ("num_hypotheses", 5), ("seed", -1), ("do_sample", "yes")],
)
def test_bad_settings_raise_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        GenerationConfig(**{field: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field,value",
    [("beam_size", "2"), ("beam_size", 2.0), ("beam_size", True), ("temperature", "1"), ("temperature", True),
     ("do_sample", 1), ("seed", 1.5), ("seed", False), ("top_k", None)],
)
def test_settings_of_the_wrong_type_raise_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        GenerationConfig(**{field: value})  # type: ignore[arg-type]


def test_float_settings_take_integers() -> None:
    assert GenerationConfig(do_sample=True, temperature=2, top_p=1, length_penalty=0).temperature == 2


def test_sampling_with_beams_and_unknown_settings_raise() -> None:
    with pytest.raises(ValueError, match="do_sample"):
        GenerationConfig(beam_size=4, do_sample=True)
    with pytest.raises(ValueError, match="beam_width"):
        GenerationConfig().update(beam_width=3)
    with pytest.raises(ValueError, match="min_new_tokens"):
        GenerationConfig(min_new_tokens=30, max_new_tokens=10)


def test_admission_refuses_what_does_not_fit(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    batch = DecodeBatch(loaded.net, rows=2, max_src=8, max_tgt=8)
    with pytest.raises(ValueError, match="rows"):
        batch.admit([((0, 0), sources[0], GenerationConfig(beam_size=3))])
    with pytest.raises(ValueError, match="source length"):
        batch.admit([((0, 0), list(range(4, 20)), GenerationConfig())])
    assert batch.free_rows == 2


def test_beam_scores_equal_teacher_forced_log_probs(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    """Each hypothesis' score is its log-probability recomputed from scratch (catches stale beam caches)."""
    model, cfg = loaded.model, loaded.model.cfg
    config = GenerationConfig(beam_size=4, num_hypotheses=4, length_penalty=0.0, max_new_tokens=20)
    checked = 0
    for src, hyps in zip(sources, generate(loaded.net, sources, config), strict=True):
        for h in hyps:
            targets = h.tokens + ([cfg.eos_id] if h.finish_reason == "eos" else [])
            with torch.no_grad():
                logits = model(torch.tensor([src]), torch.tensor([[cfg.decoder_start_id] + targets[:-1]]))[0]
            logits[:, [cfg.pad_id, cfg.bos_id]] = float("-inf")
            logp = logits.log_softmax(-1).gather(1, torch.tensor(targets)[:, None]).sum()
            assert h.score == pytest.approx(float(logp), abs=1e-3)
            checked += 1
    assert checked == 4 * len(sources)


def test_admission_takes_the_head_of_the_queue_while_rows_and_budgets_allow() -> None:
    queue = [(1, 10), (4, 10), (1, 10), (1, 10)]  # (beam_size, source tokens)
    assert admissible(queue, 8) == 4
    assert admissible(queue, 5) == 2
    assert admissible(queue, 4) == 1  # the 4 beams wait, and the items behind them too: arrival order
    assert admissible(queue, 0) == 0
    assert admissible(queue, 8, max_tokens=25) == 2
    assert admissible(queue, 8, max_tokens=5) == 1  # the first item is never refused by the budgets
    assert admissible(queue, 8, max_items=3) == 3
    assert admissible(queue, 8, max_items=0) == 1
    assert admissible([], 8) == 0
    assert admissible(iter(queue), 8) == 4


def test_an_empty_batch_takes_one_item_beyond_the_row_limit_within_the_free_rows() -> None:
    wide = [(4, 10), (1, 10)]
    assert admissible(wide, 2) == 0  # a batch still decoding waits for rows to free
    assert admissible(wide, 2, batch_empty=True) == 0  # no rows beyond free_rows are known to be free
    assert admissible(wide, 2, batch_empty=True, total_free_rows=8) == 1  # only the first, alone
    assert admissible(wide, 2, batch_empty=True, total_free_rows=3) == 0  # it must fit in the cache
    assert admissible(wide, 2, batch_empty=False, total_free_rows=8) == 0


def test_events_travel_as_plain_records() -> None:
    import pickle

    token, finish = TokenEvent(3, 1, 42, -0.5), FinishEvent(3, 1, [], "eos")
    assert token.key == finish.key == (3, 1)
    assert pickle.loads(pickle.dumps([token, finish])) == [token, finish]


def test_step_goes_through_the_batch_forward(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    """The server injects faults by replacing `forward` on a batch; the search must call it there."""
    batch = DecodeBatch(loaded.net, rows=2, max_src=32, max_tgt=8)
    batch.admit([((0, 0), sources[0], GenerationConfig(max_new_tokens=8))])

    def fail(choose: bool = False) -> torch.Tensor:
        raise RuntimeError("injected")

    batch.forward = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        step(batch)


@pytest.mark.parametrize(("dtype", "int8"), [("float32", "auto"), ("int8", "rows"), ("int8", "dynamic"),
                                           ("float16w", "auto")])
def test_a_decoding_process_keeps_the_weights_once(tiny_model_dir: Path, dtype: str, int8: str) -> None:
    """keep_modules=False (what the batcher loads) drops the modules' linear weights and decodes the same."""
    full = checkpoint.load(tiny_model_dir, device="cpu", dtype=dtype, int8=int8)
    lean = checkpoint.load(tiny_model_dir, device="cpu", dtype=dtype, keep_modules=False, int8=int8)
    sources = [full.tokenizer.encode(s) for s in SOURCES]
    for config in (GenerationConfig(max_new_tokens=12), GenerationConfig(beam_size=3, max_new_tokens=12)):
        assert generate(lean.net, sources, config) == generate(full.net, sources, config)
    if dtype == "float32" or int8 == "rows":
        linears = [m for m in lean.model.modules() if type(m) is nn.Linear]
        assert linears and all(m.weight.numel() == 0 for m in linears)
        assert lean.parameters == full.parameters and lean.device == full.device
    if int8 == "dynamic":
        quantized = [m for m in lean.model.modules() if isinstance(m, QuantizedLinear)]
        assert quantized and all(m.weight().numel() == 1 for m in quantized)


def test_rows_without_scores_decode_the_same_tokens(loaded: checkpoint.LoadedModel, sources: list[list[int]]) -> None:
    """scores=False skips normalising greedy rows; alone or sharing a batch with rows that need log-probs."""
    plain = GenerationConfig(max_new_tokens=10)
    quiet = plain.update(scores=False)
    others = [plain, plain.update(beam_size=2), plain.update(do_sample=True, seed=3)]
    for mix in ([quiet] * len(sources), [quiet, *others][: len(sources)]):
        with_scores = generate(loaded.net, sources, [plain if c is quiet else c for c in mix])
        without = generate(loaded.net, sources, mix)
        for config, a, b in zip(mix, with_scores, without, strict=True):
            assert [h.tokens for h in a] == [h.tokens for h in b]
            if config is quiet:
                assert math.isnan(b[0].score) and not math.isnan(a[0].score)
            else:
                assert b[0].score == pytest.approx(a[0].score, abs=1e-5)


@pytest.mark.parametrize("activation", [None, "relu"])
def test_float16w_products_of_a_row_do_not_depend_on_its_batch(activation: str | None) -> None:
    """float16 weights, float32 arithmetic: a row's product is the same alone (the one-row GEMM, whose copy of the
    weights is rounded the same way) and among rows of very different sizes (fbgemm's float16 product)."""
    torch.manual_seed(0)
    for out_features, in_features in ((48, 32), (800, 700)):  # a one-row GEMM weight, and one too large for it
        linear = nn.Linear(in_features, out_features)
        proj = Projection([linear], activation, half=True)
        x = torch.randn(6, in_features) * torch.tensor([0.01, 1.0, 30.0, 0.5, 100.0, 2.0])[:, None]
        together = proj(x)
        alone = torch.cat([proj(x[i : i + 1]) for i in range(len(x))])
        # equal up to float32 rounding of each row's own size (int8 quantizes the 0.01 row to nothing beside the
        # 100 row: its error there is the whole row)
        scale = together.abs().amax(1)
        assert ((alone - together).abs().amax(1) <= 1e-5 * scale).all()
        rounded = F.linear(x, linear.weight.detach().half().float(), linear.bias.detach())
        expected = ACTIVATION_FUNCTIONS[activation](rounded) if activation else rounded
        assert ((together - expected).abs().amax(1) <= 1e-5 * scale).all()


def test_float16w_decodes_as_float32_for_weights_stored_in_float16(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The shipped models are stored in float16: then float16w reads exactly float32's weights, and only the order
    of the sums differs. Tokens and scores match float32, greedy and beam, alone and batched."""
    reference = checkpoint.load(tiny_model_dir, device="cpu")
    spm = tiny_model_dir / "source.spm"
    checkpoint.save(tmp_path, reference.model, reference.info, spm, spm, weights_dtype="float16")
    full = checkpoint.load(tmp_path, device="cpu", dtype="float32")
    half = checkpoint.load(tmp_path, device="cpu", dtype="float16w")
    assert half.dtype == "float16w" and half.net.out.half is not None
    sources = [full.tokenizer.encode(s) for s in SOURCES]
    for config in (GenerationConfig(max_new_tokens=16), GenerationConfig(beam_size=3, max_new_tokens=16)):
        want = generate(full.net, sources, config)
        for got in (generate(half.net, sources, config), [generate(half.net, [s], config)[0] for s in sources]):
            assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
            for a, b in zip(got, want, strict=True):
                assert a[0].score == pytest.approx(b[0].score, abs=1e-4)


def test_float16w_runs_on_the_cpu_only(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="CPU only"):
        checkpoint.load(tiny_model_dir, device="meta", dtype="float16w")


def test_a_key_already_decoding_is_refused_before_anything_changes(loaded: checkpoint.LoadedModel,
                                                                    sources: list[list[int]]) -> None:
    batch = DecodeBatch(loaded.net, rows=4, max_src=32, max_tgt=8)
    config = GenerationConfig(max_new_tokens=8)
    batch.admit([((0, 0), sources[0], config)])
    for items in ([((0, 0), sources[1], config)], [((1, 0), sources[1], config), ((1, 0), sources[2], config)]):
        with pytest.raises(ValueError, match="already decoding"):
            batch.admit(items)
        assert batch.n == 1 and list(batch.seqs) == [(0, 0)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("compiled", [True, False])
def test_cache_row_moves_equal_fancy_indexing_with_overlap_and_repeats(compiled: bool, dtype: torch.dtype,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """`KVCache.copy_rows` on the CPU (`beam_host.move_rows` through the cache's transit array, or numpy without
    numba) against torch's gather of the old rows: sources that are written too, a source read twice, cycles,
    rows that stay, and a second move that reuses the transit array."""
    import model.cache
    from model.cache import KVCache

    if not compiled:
        monkeypatch.setattr(model.cache, "move_rows", None)
    elif model.cache.move_rows is None:
        pytest.skip("no numba")
    torch.manual_seed(0)
    cache = KVCache(2, 8, 2, 4, max_src=5, max_tgt=7, dtype=dtype)  # float16: numpy's way in both
    cache.self_kv.normal_()
    cache.cross_kv.normal_()
    cache.src_mask.copy_(torch.rand(8, 5) > 0.5)
    cache.pos.copy_(torch.arange(8))
    cache.t_hi, cache.s_hi = 4, 5
    for src, dst in (([1, 0, 3, 3, 6, 5], [0, 1, 2, 3, 5, 7]), ([2, 2, 7, 4, 0], [4, 7, 2, 0, 6])):
        before = [t.clone() for t in (cache.self_kv, cache.cross_kv, cache.src_mask, cache.pos)]
        expected = [t.clone() for t in before]
        s, d = torch.tensor(src), torch.tensor(dst)
        expected[0][:, :, d, :, :5] = before[0][:, :, s, :, :5]  # positions up to t_hi: what a step reads
        expected[1][:, :, d] = before[1][:, :, s]
        expected[2][d], expected[3][d] = before[2][s], before[3][s]
        cache.copy_rows(s, d)
        for got, want in zip((cache.self_kv, cache.cross_kv, cache.src_mask, cache.pos), expected, strict=True):
            assert torch.equal(got, want)
