"""Exports on the Hugging Face Hub: `hf://ORG/NAME[@REVISION]` wherever an export folder is taken.

`resolve_model_path` is the one place a model reference becomes a local folder: a Hub reference is
downloaded (or found in the cache) by `huggingface_hub.snapshot_download`, which honours HF_HOME,
HF_HUB_CACHE and HF_HUB_OFFLINE, and the folder it returns is then read by the same strict,
hash-checked loader as any local export. An export is uploaded as it is, e.g.
`huggingface-cli upload ORG/NAME path/to/export .`; its README.md starts with the Hub's metadata.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import huggingface_hub
from huggingface_hub import errors as hub_errors

from ecgpos.errors import EcgposError
from ecgpos.files import user_path

HUB_PREFIX = "hf://"


def is_hub_ref(value: object) -> bool:
    """Whether `value` is a `hf://ORG/NAME[@REVISION]` reference (a str; a Path would have lost the '//')."""
    return isinstance(value, str) and value.startswith(HUB_PREFIX)


def parse_hub_ref(ref: str) -> tuple[str, str | None]:
    """(repo id 'ORG/NAME', revision or None) of `hf://ORG/NAME[@REVISION]`; EcgposError when malformed."""
    body = ref[len(HUB_PREFIX) :]
    repo_id, _, revision = body.partition("@")
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts) or (_ and not revision):
        raise EcgposError(f"{ref}: a Hub reference is hf://ORG/NAME or hf://ORG/NAME@REVISION")
    return repo_id, revision or None


def hub_snapshot(ref: str) -> Path:
    """The local snapshot folder of a Hub reference: downloaded into, or found in, the Hub cache."""
    repo_id, revision = parse_hub_ref(ref)
    offline = bool(huggingface_hub.constants.HF_HUB_OFFLINE)
    where = f"{ref} (cache {huggingface_hub.constants.HF_HUB_CACHE})"
    try:
        return Path(huggingface_hub.snapshot_download(repo_id=repo_id, revision=revision, repo_type="model"))
    except hub_errors.RepositoryNotFoundError:
        raise EcgposError(
            f"{ref}: no Hub repository {repo_id!r} (or it is private; log in with `hf auth login`)"
        ) from None
    except hub_errors.RevisionNotFoundError:
        raise EcgposError(f"{ref}: the Hub repository {repo_id!r} has no revision {revision!r}") from None
    except hub_errors.GatedRepoError:
        raise EcgposError(f"{ref}: the Hub repository {repo_id!r} is gated; accept its terms and log in") from None
    except hub_errors.LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise EcgposError(
            f"{where}: not in the Hub cache and {why}; download it once with network access"
            + (f" or check the revision {revision!r}" if revision else "")
        ) from None
    except hub_errors.HFValidationError as err:
        raise EcgposError(f"{ref}: not a valid Hub repository id or revision: {str(err).splitlines()[0]}") from None
    except (hub_errors.HfHubHTTPError, OSError) as err:
        detail = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise EcgposError(f"{where}: the download failed: {detail}") from None


def resolve_model_path(ref: str | Path) -> Path:
    """A local folder for an export reference: `hf://...` through the Hub cache, anything else as a
    path with `~` expanded. Nothing is checked here beyond the download; the loaders check the folder."""
    if is_hub_ref(ref):
        return hub_snapshot(str(ref))
    if not isinstance(ref, (str, Path)):
        raise EcgposError(f"an export folder is a str or Path (or hf://ORG/NAME), got {type(ref).__name__} {ref!r}")
    return Path(ref).expanduser()


def model_ref(text: str) -> str | Path:
    """The argparse type of every option that takes an export: a Hub reference kept as written (a Path
    would fold its '//'), anything else as `ecgpos.files.user_path`."""
    if text.startswith(HUB_PREFIX):
        try:
            parse_hub_ref(text)
        except EcgposError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text
    return user_path(text)
