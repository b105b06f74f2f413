"""Every file the package loads is read in a format that cannot run code (safetensors, JSON,
``.npy`` without pickles, ``torch.load(weights_only=True)``, GGUF): a planted pickle payload
is refused with an error naming the file and never executed. Damaged files are clear errors
too. Nothing here loads a model."""

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from specdec_kernels import cli
from specdec_kernels.training.medusa_data import chunk_path, load_cache, load_chunk, save_chunk
from specdec_kernels.medusa.heads import MedusaHeads, load_heads

PACKAGE = Path(__file__).resolve().parents[1] / "specdec_kernels"


class Payload:
    """Unpickling this creates ``marker``: proof that a loader ran the pickle's code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _records(rows=(3, 1, 4), hidden=5):
    gen = torch.Generator().manual_seed(0)
    return [
        {"prompt": f"prompt {i}", "sampled": i % 2 == 1, "text": f"answer {i}",
         "tokens": list(range(i, i + n)),
         "features": torch.randn(n, hidden, generator=gen).to(torch.float16)}
        for i, n in enumerate(rows)
    ]


def test_cache_chunks_round_trip(tmp_path):
    records = _records()
    save_chunk(records, chunk_path(tmp_path, 0))
    loaded = load_cache(tmp_path)
    assert [r["tokens"] for r in loaded] == [r["tokens"] for r in records]
    assert [(r["prompt"], r["sampled"], r["text"]) for r in loaded] == [
        (r["prompt"], r["sampled"], r["text"]) for r in records]
    for got, want in zip(loaded, records):
        assert torch.equal(got["features"], want["features"])


def test_a_planted_pickle_chunk_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "payload-ran"
    first = tmp_path / "data" / "first"
    first.mkdir(parents=True)
    (first / "chunk_0000.pt").write_bytes(pickle.dumps([Payload(marker)]))
    with pytest.raises(ValueError, match=r"chunk_0000\.pt is a pickle file .* never reads them"):
        load_cache(first)
    assert not marker.exists()


def test_training_on_a_planted_pickle_is_a_user_error_before_any_model(tmp_path, capsys):
    marker = tmp_path / "payload-ran"
    data = tmp_path / "data"
    (data / "first").mkdir(parents=True)
    torch.save([Payload(marker)], data / "first" / "chunk_0000.pt")  # the old format
    for extra in (["--skip-data"], []):  # training alone, and the data phase first
        with pytest.raises(SystemExit) as exit_:
            cli.main(["train", "medusa", "--data", str(data), "--out", str(tmp_path / "heads"),
                      *extra])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.splitlines()[-1].startswith("specdec: error: ")
        assert "is a pickle file" in err and "Traceback" not in err
        assert "Loading weights" not in err
    assert not marker.exists()


def test_damaged_or_foreign_chunks_are_clear_errors(tmp_path):
    save_chunk(_records(), chunk_path(tmp_path, 0))
    whole = chunk_path(tmp_path, 0).read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ValueError, match=r"cut\.safetensors is not a Medusa cache chunk "
                                         r".*unreadable as safetensors"):
        load_chunk(cut)
    from safetensors.torch import save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2, 2)}, str(foreign))
    with pytest.raises(ValueError, match="foreign.safetensors is not a Medusa cache chunk"):
        load_chunk(foreign)
    lying = tmp_path / "lying.safetensors"
    save_file({"features": torch.zeros(4, 5, dtype=torch.float16),
               "tokens": torch.zeros(4, dtype=torch.int64),
               "lengths": torch.tensor([3, 3])},
              str(lying), metadata={"format": "specdec_kernels.medusa.cache/1", "records": "[]"})
    with pytest.raises(ValueError, match="do not fit together"):
        load_chunk(lying)


def _heads_folder(tmp_path) -> Path:
    folder = tmp_path / "heads"
    MedusaHeads(8, 16, 2, 1).save(folder)
    return folder


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_heads_file_is_a_user_error(tmp_path, damage, capsys):
    folder = _heads_folder(tmp_path)
    weights = folder / "medusa_heads.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\xff" * 64)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_heads(folder)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "hello", "--drafter", "medusa", "--heads", str(folder)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]
    assert last.startswith("specdec: error: ") and "not a readable safetensors file" in last
    assert "Traceback" not in err


def test_a_fasterdecoding_pickle_is_read_weights_only(tmp_path):
    """The FasterDecoding ``.pt`` heads go through ``torch.load(weights_only=True)``: plain
    tensors load, a payload is refused and never run."""
    folder = tmp_path / "fd"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 1,
                                                    "medusa_num_layers": 1}))
    state = {"0.0.linear.weight": torch.zeros(8, 8), "0.0.linear.bias": torch.zeros(8),
             "0.1.weight": torch.zeros(16, 8)}
    torch.save(state, folder / "medusa_lm_head.pt")
    assert load_heads(folder).num_heads == 1
    marker = tmp_path / "payload-ran"
    torch.save({**state, "0.1.weight": Payload(marker)}, folder / "medusa_lm_head.pt")
    with pytest.raises(ValueError, match="refused, never executed"):
        load_heads(folder)
    assert not marker.exists()


def test_a_pickled_datastore_array_is_refused_and_never_run(tmp_path):
    from specdec_kernels.retrieval.datastore import Datastore

    marker = tmp_path / "payload-ran"
    store = _store(tmp_path)
    np.save(store / "sa.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match=r"sa\.npy is not a plain \.npy array"):
        Datastore(store)
    assert not marker.exists()


def _store(tmp_path) -> Path:
    from specdec_kernels.retrieval.datastore import build_datastore

    out = tmp_path / "store"
    build_datastore([[1, 2, 3, 1, 2, 4], [2, 3, 1]], out, fingerprint={"vocab_size": 8})
    return out


def test_no_loader_in_the_package_can_run_code():
    """The audit kept: every ``torch.load`` passes ``weights_only=True``, no ``np.load``
    allows pickles, and nothing calls pickle's loaders."""
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        for call in re.finditer(r"torch\.load\(", text):
            arguments = text[call.end() : text.find("\n\n", call.end())]  # the statement
            assert "weights_only=True" in arguments, f"{path}: {text[call.start():][:80]}"
        assert "allow_pickle=True" not in text, path
        assert not re.search(r"\bpickle\.loads?\(|\bUnpickler\(", text), path
        assert "weights_only=False" not in text, path
