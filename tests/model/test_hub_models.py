"""Hugging Face Hub ids in `load_model`: a Hub cache laid out by hand (models--org--name/snapshots/<rev>,
refs/<branch>) under tmp_path, HF_HUB_OFFLINE=1 (nothing is fetched); the loaded model's logits equal
transformers' on the same weights, a revision picks its snapshot, a missing id fails naming it."""
from __future__ import annotations

import numpy as np
import pytest

from magicdec_jax import logits
from magicdec_jax.checkpoints import load_model

from conftest import random_hf_llama

torch = pytest.importorskip("torch")

REV_MAIN, REV_OLD = "a" * 40, "b" * 40


def tiny_llama(seed):
  return random_hf_llama(seed, 0.2, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.15)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
  """org/tiny with two snapshots: main -> REV_MAIN (seed 0), the tag v0 -> REV_OLD (seed 1)."""
  repo = tmp_path / "hub" / "models--org--tiny"
  models = {}
  for rev, seed in ((REV_MAIN, 0), (REV_OLD, 1)):
    models[rev] = tiny_llama(seed)
    models[rev].save_pretrained(repo / "snapshots" / rev)
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(REV_MAIN)
  (repo / "refs" / "v0").write_text(REV_OLD)
  monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  return models


def hf_logits(model, ids):
  with torch.no_grad():
    return model(torch.tensor(ids)).logits.float().numpy()


def test_hub_id_loads_the_cached_snapshot(hub_cache):
  ids = np.random.default_rng(0).integers(0, 128, size=(2, 12)).tolist()
  model = load_model("org/tiny")
  assert model.name == "org/tiny"
  np.testing.assert_allclose(logits(model, ids), hf_logits(hub_cache[REV_MAIN], ids), atol=1e-4, rtol=0)
  for rev in ("v0", REV_OLD):
    old = load_model("org/tiny", revision=rev)
    np.testing.assert_allclose(logits(old, ids), hf_logits(hub_cache[REV_OLD], ids), atol=1e-4, rtol=0)
  assert np.abs(logits(old, ids) - logits(model, ids)).max() > 1e-2


def test_missing_hub_id_offline_fails_naming_it(hub_cache):
  with pytest.raises(ValueError, match="'org/absent'.*not in .*HF_HUB_OFFLINE is set"):
    load_model("org/absent")
  with pytest.raises(ValueError, match="revision v9"):
    load_model("org/tiny", revision="v9")
  with pytest.raises(ValueError, match="revision 'main' is for Hugging Face Hub ids"):
    load_model("smollm2-135m", revision="main")
  with pytest.raises(ValueError, match="not an existing path, a Hugging Face Hub id"):
    load_model("no-such-model")


def test_the_download_patterns_take_what_the_loader_reads():
  """transformers' file names (a single file, shards, the index) and the tokenizer's; not Mistral's
  consolidated.safetensors, the same weights again in another layout."""
  from fnmatch import fnmatch
  from magicdec_jax import hub
  take = lambda name: any(fnmatch(name, p) for p in hub.FILES)
  assert all(map(take, ("model.safetensors", "model-00001-of-00004.safetensors", "model.safetensors.index.json",
                        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                        "chat_template.jinja")))
  assert not any(map(take, ("consolidated.safetensors", "pytorch_model.bin")))
