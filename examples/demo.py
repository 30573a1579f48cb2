"""The main job, GPU-free: `verirl launch` end to end on the shipped fakes.

What runs, all on loopback in a temporary folder that is removed afterwards:

* `fakes.FakeEnvServer` as the reward environment server (healthy after 0.5 s);
* `fakes.FakeHub` holding a run's ``checkpoint-10`` and ``checkpoint-20``;
* ``verirl launch`` with a 2-GPU plan and the fake vLLM server program
  (``python -m fakes.vllm_serve``) as the server command, which starts the
  server, waits for the env server and fetches ``checkpoint-20`` at the same
  time, then runs ``examples/train_fake.py``, which checks the server and
  writes ``checkpoint-30``.

Run it with ``nox -s demo`` (or ``python examples/demo.py``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fakes import FakeEnvServer, FakeHub
from verirl import find_free_port

REPO = "demo/grpo-run"
HERE = Path(__file__).resolve().parent


def main() -> int:
    """Run the demo; return ``verirl launch``'s exit code."""
    with (
        tempfile.TemporaryDirectory(prefix="verirl-demo-") as tmp,
        FakeEnvServer(ready_after=0.5) as env_server,
        FakeHub() as hub,
    ):
        sizes = {
            folder: hub.add_checkpoint(REPO, folder, step, size=256 * 1024)
            for folder, step in (("checkpoint-10", 10), ("checkpoint-20", 20))
        }
        output_dir = Path(tmp) / "out"
        command = [
            sys.executable, "-m", "verirl", "launch",
            "--gpus", "2",
            "--model", "demo/tiny-model",
            "--vllm-command", f"{shlex.quote(sys.executable)} -m fakes.vllm_serve",
            "--vllm-port", str(find_free_port()),
            "--log-dir", tmp,
            "--env-url", env_server.url,
            "--output-dir", str(output_dir),
            "--hub-repo", REPO,
            "--hub-endpoint", hub.endpoint,
            "--resume", "auto",
            "--",
            sys.executable, str(HERE / "train_fake.py"), "--output-dir", str(output_dir),
        ]  # fmt: skip
        env = dict(os.environ)
        env.update(
            {
                "HF_HOME": str(Path(tmp) / "hf-home"),
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            }
        )
        env.pop("HF_TOKEN", None)
        print("$ verirl launch --gpus 2 ... -- python examples/train_fake.py\n", flush=True)
        start = time.monotonic()
        code = subprocess.run(command, env=env, check=False).returncode
        took = time.monotonic() - start

        written = sorted(p.name for p in output_dir.glob("checkpoint-*"))
        chosen = sizes["checkpoint-20"]
        print("\n== summary ==")
        print(f"verirl launch exit code : {code}")
        print(f"wall time               : {took:.2f}s")
        print(f"checkpoints on the Hub  : {', '.join(sizes)} ({sum(sizes.values()):,} bytes)")
        print(
            f"bytes downloaded        : {hub.bytes_served:,} "
            f"(checkpoint-20 is {chosen:,}; ratio {hub.bytes_served / chosen:.2f})"
        )
        print(f"checkpoints written     : {', '.join(written) or 'none'}")
        if code == 0 and "checkpoint-30" not in written:
            print("demo FAILED: the training script did not write checkpoint-30")
            return 1
        return code


if __name__ == "__main__":
    sys.exit(main())
