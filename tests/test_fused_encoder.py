"""The fused CPU encoder of short sentences (model/fused_encoder.py) against the operator-by-operator encoder."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("numba", reason="the fused encoder needs numba (the GPU script's bare machine lacks it)")

from model import frozen, fused_encoder  # noqa: E402
from model.frozen import FrozenTransformer, freeze  # noqa: E402
from model.fused_encoder import FusedEncoder  # noqa: E402
from model.generation import GenerationConfig  # noqa: E402
from tests.helpers import nets, released_decodes_as_kept
from tests.tiny import tiny_config, tiny_model  # noqa: E402

SHORT = [[5, 9, 14, 22, 7, 2], [30, 2], [40, 41, 42, 2]]
LONG = [list(range(10, 40)) + [2], list(range(50, 77)) + [2]]  # longer than the limits the tests set (`max_tokens`)


def encode(net: FrozenTransformer, sources: list[list[int]]) -> list[torch.Tensor]:
    """Each source's cross-attention K/V over its own tokens (L, 2, H, n, Dh), encoded as one admission."""
    S = max(len(s) for s in sources)
    src = torch.tensor([s + [0] * (S - len(s)) for s in sources])
    with torch.inference_mode():
        kv, _ = net.encode_cross(src)  # (L, 2, B, H, S, Dh)
    return [kv[:, :, b, :, : len(s)] for b, s in enumerate(sources)]


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The lengths of the sentences the fused encoder encodes."""
    lengths: list[int] = []
    original = FusedEncoder.__call__

    def call(self: FusedEncoder, x: torch.Tensor, n: list[int]) -> torch.Tensor:
        lengths.extend(n)
        return original(self, x, n)

    monkeypatch.setattr(FusedEncoder, "__call__", call)
    return lengths


@pytest.mark.parametrize(("norm", "activation"), [("pre", "relu"), ("post", "gelu"), ("post", "swish")])
def test_fused_encoder_equals_the_operator_encoder_in_float32(norm: str, activation: str, taken: list[int]) -> None:
    fused, plain = nets("float32", norm=norm, activation=activation)
    assert fused.fused_encoder is not None and fused.fused_encoder.ready() and plain.fused_encoder is None
    assert fused.fused_encoder.max_tokens == fused.cfg.max_positions  # every sentence, unless told otherwise
    fused.fused_encoder.max_tokens = 24
    sources = [SHORT[0], LONG[0], SHORT[1], SHORT[2], LONG[1]]
    for a, b in zip(encode(fused, sources), encode(plain, sources), strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()
    assert sorted(taken) == sorted(len(s) for s in SHORT)  # the short ones, and only they, went the fused way


def test_fused_int8_encoder_is_close_to_fbgemms(taken: list[int]) -> None:
    """The same int8 weights and input ranges: only a value a rounding step from a quantization boundary moves."""
    fused, plain = nets("int8", norm="pre", activation="relu")
    assert fused.fused_encoder is not None and fused.fused_encoder.ready()
    for a, b in zip(encode(fused, SHORT), encode(plain, SHORT), strict=True):
        assert (a - b).abs().max() <= 2e-2 * b.abs().max()
    assert sorted(taken) == sorted(len(s) for s in SHORT)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_a_sentence_encodes_bit_for_bit_the_same_alone_and_in_any_admission(dtype: str, taken: list[int]) -> None:
    """Short sentences go the fused way and long ones the operator way whatever shares their admission; int8 sums
    are exact integers in any order, float32 ones are summed in order (`model.kernels._panel_rows`), and the rest
    of a token's arithmetic is its own."""
    fused, _ = nets(dtype, norm="pre", activation="relu")
    assert fused.fused_encoder is not None
    fused.fused_encoder.max_tokens = limit = 8  # (by default every sentence is the fused encoder's)
    short = [s for s in SHORT if len(s) <= limit]
    assert short and all(len(s) > limit for s in LONG)
    mixed = [LONG[0], *short, LONG[1]]
    together = encode(fused, mixed)
    for source, got in zip(mixed, together, strict=True):
        (alone,) = encode(fused, [source])
        assert torch.equal(got, alone)
    assert sorted(taken) == sorted([len(s) for s in short] * 2)  # together, then each alone


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_an_admission_cut_over_threads_encodes_bit_for_bit_as_one(dtype: str, taken: list[int],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Large admissions run in parts at once, one per torch thread; a sentence's rows are computed on their own,
    so its numbers are the same in any part and alone."""
    fused, _ = nets(dtype, norm="pre", activation="relu")
    assert fused.fused_encoder is not None
    fused.fused_encoder.max_tokens = 64
    sources = [*SHORT, *LONG, *SHORT]
    whole = encode(fused, sources)
    cuts: list[int] = []
    original = fused_encoder.split
    monkeypatch.setattr(fused_encoder, "split", lambda lengths, parts: cuts.append(parts) or original(lengths, 3))
    monkeypatch.setattr(fused_encoder, "SPLIT_MIN_TOKENS", 1)
    parts = encode(fused, sources)
    assert cuts  # it was cut (into three parts)
    for a, b in zip(whole, parts, strict=True):
        assert torch.equal(a, b)
    (alone,) = encode(fused, [LONG[1]])
    assert torch.equal(alone, whole[4])


def on_one_then_two_threads(fused: FrozenTransformer, sources: list[list[int]], monkeypatch: pytest.MonkeyPatch
                            ) -> tuple[list[list[torch.Tensor]], list[tuple[int, ...]]]:
    """The sources encoded on one torch thread, then on two; and the (part, parts) of each compiled call, () for a
    call in one part."""
    encoder = fused.fused_encoder
    assert encoder is not None
    threads = torch.get_num_threads()
    results, seen = [], []
    original = encoder._encode
    monkeypatch.setattr(encoder, "_encode", lambda *a: seen.append(a[3:5]) or original(*a))
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            results.append(encode(fused, sources))
    finally:
        torch.set_num_threads(threads)
    return results, seen


@pytest.mark.parametrize(("dtype", "norm"), [("float32", "pre"), ("float32", "post"), ("int8", "pre")])
def test_an_admission_in_parts_of_every_product_encodes_bit_for_bit_as_one(dtype: str, norm: str, taken: list[int],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A small admission on two threads is cut into two parts of every product and attention (by heads of
    sentences), run at once: the same numbers as in one part."""
    fused, _ = nets(dtype, norm=norm, activation="relu")
    encoder = fused.fused_encoder
    assert encoder is not None
    encoder.max_tokens = 64
    results, seen = on_one_then_two_threads(fused, [*SHORT, LONG[0]], monkeypatch)
    assert sorted(seen) == [(), (0, 2), (1, 2)]  # one part, then two
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_one_long_sentence_on_two_threads_is_cut_into_parts_of_every_product(dtype: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An admission long enough to cut by sentences, but of fewer sentences than threads, goes in parts of every
    product (one sentence by sentences ran on one thread alone): the same numbers as in one part."""
    fused, _ = nets(dtype, norm="pre", activation="relu")
    encoder = fused.fused_encoder
    assert encoder is not None
    monkeypatch.setattr(fused_encoder, "SPLIT_MIN_TOKENS", 4)
    source = max(LONG, key=len)
    assert len(source) >= fused_encoder.SPLIT_MIN_TOKENS
    results, seen = on_one_then_two_threads(fused, [source], monkeypatch)
    assert sorted(seen) == [(), (0, 2), (1, 2)]  # alone on one thread, then two parts
    assert torch.equal(results[0][0], results[1][0])


def test_split_cuts_runs_of_about_as_many_tokens() -> None:
    assert fused_encoder.split([5, 5, 5, 5], 2) == [(0, [5, 5]), (10, [5, 5])]
    assert fused_encoder.split([3, 20, 4, 4, 4], 2) == [(0, [3, 20]), (23, [4, 4, 4])]
    assert fused_encoder.split([10], 4) == [(0, [10])]
    assert fused_encoder.split([1, 2, 3], 1) == [(0, [1, 2, 3])]
    runs = fused_encoder.split([7] * 9 + [2], 3)
    assert len(runs) == 3 and sum(map(len, (r for _, r in runs))) == 10
    assert [first for first, _ in runs] == [0, *(sum(sum(r) for _, r in runs[:i]) for i in (1, 2))]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_the_operator_encoder_attends_by_length_as_sdpa_does_over_the_padded_batch(
        norm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the CPU in float32 the operator-by-operator encoder attends sentence by sentence over each one's own
    tokens (model.kernels.attend_packed), with no padding: the same as SDPA over the padded batch with a mask."""
    _, plain = nets("float32", norm=norm)
    sources = [LONG[0], SHORT[0], SHORT[1], LONG[1], SHORT[2]]  # mixed lengths: most of the padded batch is padding
    lengths: list[int] = []
    kernel = frozen.attend_packed

    def counted(qkv, starts, ns, H, out):  # type: ignore[no-untyped-def]
        lengths.extend(ns.tolist())
        kernel(qkv, starts, ns, H, out)

    monkeypatch.setattr(frozen, "attend_packed", counted)
    by_length = encode(plain, sources)
    assert lengths == [len(s) for s in sources] * plain.cfg.encoder_layers  # every layer, each sentence its own
    monkeypatch.setattr(frozen, "attend_packed", None)  # the padded batch and SDPA, as on other devices
    padded = encode(plain, sources)
    for a, b in zip(by_length, padded, strict=True):
        assert (a - b).abs().max() <= 1e-5 * b.abs().max()


@pytest.mark.parametrize("dtype", ["float32", "int8", "rows8"])
def test_a_released_operator_encoder_leaves_the_fused_encoders_outputs(dtype: str) -> None:
    """Where the fused encoder takes every length, loading with keep_modules=False drops the operator encoder's
    weights (`release_operator_encoder`): the same tokens as a network that kept them, and the operator encoder, which
    calibration needs, refuses with a clear error instead of reading weights that are gone."""
    if dtype == "rows8":
        model = tiny_model(tiny_config())
        net, plain = freeze(model, rows8=True), freeze(model, fused=False, rows8=True)
    else:
        net, plain = nets(dtype, norm="pre", activation="relu")
    assert plain.release_operator_encoder() is False  # no fused encoder to take its place
    fused = net.fused_encoder
    if fused is None or fused.max_tokens < net.cfg.max_positions:
        pytest.skip("this CPU's fused int8 encoder takes short sentences only")
    assert net.release_operator_encoder() and not net.operator_encoder
    released_decodes_as_kept(net, plain, (GenerationConfig(max_new_tokens=12),
                                          GenerationConfig(max_new_tokens=12, beam_size=3)))
