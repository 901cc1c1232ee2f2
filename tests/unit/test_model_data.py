"""The GPT, its pipeline stages, and the byte-level corpus and batches."""

import hashlib

import pytest
import torch

from testbed.model.gpt import GPT, Stage, build_model, lm_loss
from testbed.spec.model import ModelConfig, stage_layers
from testbed.train.corpus import DataError, corpus_files
from testbed.train.data import TRAIN_FRACTION, batch, load_corpus, split

SMALL = ModelConfig(n_layers=5, d_model=16, n_heads=2, seq_len=8)


# ---- stage partition -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "n_layers, n_stages", [(1, 1), (6, 1), (6, 2), (6, 3), (6, 4), (6, 6), (7, 3), (5, 2), (10, 4), (12, 5), (3, 3)]
)
def test_stage_layers_contiguous_cover_each_block_once(n_layers, n_stages):
    parts = [stage_layers(n_layers, n_stages, s) for s in range(n_stages)]
    assert [i for p in parts for i in p] == list(range(n_layers))  # in order, each block once
    for p in parts:
        assert p.step == 1 and len(p) >= 1
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1  # as even as possible
    assert sizes == sorted(sizes, reverse=True)  # earlier stages take the remainder


# ---- model -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        SMALL,
        ModelConfig(),
        ModelConfig(n_layers=2, d_model=64, n_heads=4, seq_len=128),
        ModelConfig(n_layers=1, d_model=8, n_heads=1, seq_len=3, vocab=10),
    ],
)
def test_params_equals_real_parameter_count(cfg):
    torch.manual_seed(0)
    assert cfg.params() == sum(p.numel() for p in GPT(cfg).parameters())


def test_build_model_is_seeded():
    a, b, c = build_model(SMALL, 3), build_model(SMALL, 3), build_model(SMALL, 4)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


@pytest.mark.parametrize("n_stages", [1, 2, 3, 5])
def test_chained_stages_equal_the_whole_model(n_stages):
    idx = torch.randint(0, SMALL.vocab, (3, SMALL.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = build_model(SMALL, 7)(idx)
        # as the workers do: every stage from its own seeded copy of the whole model
        stages = [Stage(build_model(SMALL, 7), s, n_stages) for s in range(n_stages)]
        x = idx
        for s, st in enumerate(stages):
            x = st(x)
            if s < n_stages - 1:
                assert x.shape == (3, SMALL.seq_len, SMALL.d_model)
    assert x.shape == want.shape == (3, SMALL.seq_len, SMALL.vocab)
    assert torch.allclose(x, want, atol=1e-6)


@pytest.mark.parametrize("n_stages", [1, 2, 3, 5])
def test_stages_partition_the_parameters(n_stages):
    full = build_model(SMALL, 0)
    ids = [id(p) for s in range(n_stages) for p in Stage(full, s, n_stages).parameters()]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in full.parameters()}
    first, last = Stage(full, 0, n_stages), Stage(full, n_stages - 1, n_stages)
    assert first.first and hasattr(first, "tok") and last.last and hasattr(last, "head")


def test_lm_loss_is_mean_next_byte_cross_entropy():
    logits = torch.zeros(2, 3, 4)
    logits[0, 0, 1] = 2.0
    targets = torch.tensor([[1, 0, 0], [3, 3, 2]])
    per_token = [-torch.log_softmax(logits[b, t], -1)[targets[b, t]] for b in range(2) for t in range(3)]
    assert lm_loss(logits, targets).item() == pytest.approx(float(sum(per_token) / 6))


def test_forward_flops():
    cfg = SMALL
    tokens = 10
    attention = 2 * cfg.n_layers * cfg.seq_len * cfg.d_model
    assert cfg.forward_flops(tokens) == 2 * cfg.params() * tokens + attention * tokens
    assert cfg.forward_flops(2 * tokens) == 2 * cfg.forward_flops(tokens)


# ---- data ------------------------------------------------------------------------------------


def test_load_corpus_file(tmp_path):
    text = b"hello, world\n" * 50
    (tmp_path / "a.txt").write_bytes(text)
    tokens, sha = load_corpus(tmp_path / "a.txt")
    assert tokens.dtype == torch.uint8
    assert bytes(tokens.tolist()) == text
    assert sha == hashlib.sha256(text).hexdigest()


def test_load_corpus_folder_in_sorted_order(tmp_path):
    (tmp_path / "b.txt").write_bytes(b"BBB")
    (tmp_path / "a.txt").write_bytes(b"AAA")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"CCC")
    (tmp_path / "c.txt").write_bytes(b"ccc")
    assert [p.relative_to(tmp_path).as_posix() for p in corpus_files(tmp_path)] == [
        "a.txt",
        "b.txt",
        "c.txt",
        "sub/c.txt",
    ]
    tokens, sha = load_corpus(tmp_path)
    assert bytes(tokens.tolist()) == b"AAABBBcccCCC"
    assert sha == hashlib.sha256(b"AAABBBcccCCC").hexdigest()
    # max_bytes cuts across files, in the same order
    tokens, sha = load_corpus(tmp_path, max_bytes=5)
    assert bytes(tokens.tolist()) == b"AAABB" and sha == hashlib.sha256(b"AAABB").hexdigest()


def test_load_corpus_missing_and_empty(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_corpus(tmp_path / "nope")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match="empty"):
        load_corpus(tmp_path / "empty.txt")
    (tmp_path / "dir").mkdir()
    with pytest.raises(DataError, match="empty"):
        load_corpus(tmp_path / "dir")


def test_split_ninety_percent_train():
    corpus = torch.arange(100, dtype=torch.uint8)
    train, val = split(corpus)
    assert len(train) == int(100 * TRAIN_FRACTION) == 90
    assert torch.equal(torch.cat([train, val]), corpus)


def corpus_tokens(n=1000):
    return torch.tensor([(i * 7 + i // 13) % 256 for i in range(n)], dtype=torch.uint8)


def test_batch_deterministic_per_seed_and_iteration():
    tokens = corpus_tokens()
    x1, y1 = batch(tokens, 4, 16, seed=0, iteration=3)
    x2, y2 = batch(tokens, 4, 16, seed=0, iteration=3)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(batch(tokens, 4, 16, seed=0, iteration=4)[0], x1)
    assert not torch.equal(batch(tokens, 4, 16, seed=1, iteration=3)[0], x1)
    # independent of torch's global generator
    torch.manual_seed(123)
    assert torch.equal(batch(tokens, 4, 16, seed=0, iteration=3)[0], x1)


def test_batch_targets_are_inputs_shifted_by_one():
    tokens = torch.arange(200, dtype=torch.uint8)  # each byte value equals its offset
    x, y = batch(tokens, 6, 10, seed=5, iteration=0)
    assert x.shape == y.shape == (6, 10) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y, x + 1)
    for row in x:  # every row is a contiguous window of the corpus
        assert torch.equal(row, torch.arange(int(row[0]), int(row[0]) + 10))
        assert 0 <= int(row[0]) and int(row[0]) + 10 < 200


def test_batch_corpus_too_small():
    with pytest.raises(DataError, match="seq_len"):
        batch(torch.arange(8, dtype=torch.uint8), 2, seq_len=8, seed=0, iteration=0)
    x, y = batch(torch.arange(9, dtype=torch.uint8), 2, seq_len=8, seed=0, iteration=0)  # seq_len + 1: enough
    assert torch.equal(x[0], torch.arange(8)) and torch.equal(y[0], torch.arange(1, 9))


def test_batch_tiny_corpus_file_raises(tmp_path):
    (tmp_path / "tiny.txt").write_bytes(b"abc")
    tokens, _ = load_corpus(tmp_path / "tiny.txt")
    with pytest.raises(DataError):
        batch(tokens, 1, 8, 0, 0)
