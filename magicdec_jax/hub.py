"""Hugging Face Hub model ids ("org/name") resolved to a local snapshot directory, as vLLM and SGLang do.

`huggingface_hub.snapshot_download` fetches (or, with HF_HUB_OFFLINE set, only looks up) the files the HF
loader reads - config and tokenizer JSON, safetensors, a chat template - into the Hub cache (HF_HUB_CACHE,
read when called), at `revision` (a branch, tag or commit; default main). Pickled weights are never fetched.
"""
from __future__ import annotations

import os
import re

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
FILES = ("*.json", "model*.safetensors", "*.jinja")   # (the loader's: not Mistral's consolidated.safetensors)


def is_hub_id(name: str) -> bool:
  """Whether `name` has the form of a Hub repo id (org/name), e.g. "Qwen/Qwen2.5-7B-Instruct"."""
  return bool(HUB_ID.fullmatch(name)) and ".." not in name


def offline() -> bool:
  """HF_HUB_OFFLINE set to a true value: look in the cache only."""
  return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_snapshot(repo_id: str, revision: str | None = None) -> str:
  """The local directory of `repo_id` at `revision`, downloaded unless offline; ValueError naming the id
  when it cannot be had (not in the cache offline, no such repo or revision, gated, network).
  huggingface_hub is imported here: it costs half a second, and most loads never need it."""
  from huggingface_hub import snapshot_download
  from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                      RepositoryNotFoundError, RevisionNotFoundError)
  cache = os.environ.get("HF_HUB_CACHE") or None
  try:
    return snapshot_download(repo_id, revision=revision, allow_patterns=list(FILES), cache_dir=cache,
                             local_files_only=offline())
  except LocalEntryNotFoundError as e:
    where = cache or "the default Hugging Face cache"
    how = ("HF_HUB_OFFLINE is set: download it first (`hf download " + repo_id + "`) or unset HF_HUB_OFFLINE"
           if offline() else "and it could not be downloaded")
    raise ValueError(f"model {repo_id!r} (revision {revision or 'main'}) is not in {where}; {how}") from e
  except (RepositoryNotFoundError, RevisionNotFoundError, GatedRepoError) as e:
    raise ValueError(f"cannot fetch model {repo_id!r} (revision {revision or 'main'}) from the Hugging Face "
                     f"Hub: {type(e).__name__}: {str(e).splitlines()[0]}") from e
  except (HfHubHTTPError, OSError) as e:
    raise ValueError(f"cannot fetch model {repo_id!r} from the Hugging Face Hub: {e}") from e
