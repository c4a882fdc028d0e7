"""Writes the lab serving host's model pair: small random-weight checkpoints built from the configs in
lab/files/models/ (a Qwen3-style target and a z-lab-format DFlash drafter), never downloaded.

usage: python lab/make_models.py OUTPUT_DIR   (run with .venv-rt's Python; ddtree_runtime must import)
OUTPUT_DIR/<model name>/ gets config.json and model.safetensors for each model in lab/files/models/.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ddtree_runtime.reference import DFlashConfig, Qwen3Config, random_dflash, random_qwen3, save_dflash, save_qwen3

CONFIGS = Path(__file__).resolve().parent / "files" / "models"
SEED = 20261130


def write_pair(output: Path) -> None:
    for index, config_path in enumerate(sorted(CONFIGS.glob("*/config.json"))):
        config = json.loads(config_path.read_text())
        destination = output / config_path.parent.name
        if "DFlashDraftModel" in config.get("architectures", []):
            save_dflash(random_dflash(DFlashConfig.from_dict(config), seed=SEED + index), destination)
        else:
            save_qwen3(random_qwen3(Qwen3Config.from_dict(config), seed=SEED + index), destination)


if __name__ == "__main__":
    write_pair(Path(sys.argv[1]))
