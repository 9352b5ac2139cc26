"""A toy training task that speaks the drain protocol of the `local-process` backend.

It fits y = 3x + 1 by SGD in a duty cycle (busy `--util-pct` percent of each step) and
answers the platform's signals:

- SIGUSR1  pre-drain warning: noted in the log (and in the next metrics line);
- SIGUSR2  checkpoint request: write the checkpoint, then acknowledge by writing
           `<checkpoint>.done` with the token found in `<checkpoint>.request`;
- SIGTERM  checkpoint (unless the latest one is current) and exit 0.

Fault behaviours for tests: `--checkpoint-seconds` (slow checkpoint), `--ignore-sigterm`,
`--crash-on checkpoint|warning` (exit abruptly, code 70, mid-drain).
Run: python -m market_pipeline.workers.toy_trainer --checkpoint DIR/ckpt.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CRASH_EXIT_CODE = 70


@dataclass
class Flags:
    warned: bool = False
    checkpoint_requested: bool = False
    terminate: bool = False


@dataclass
class Model:
    w: float = 0.0
    b: float = 0.0
    step: int = 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="toy_trainer", description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--metrics", type=Path, default=None, help="JSON-lines utilisation log")
    parser.add_argument("--util-pct", type=float, default=60.0)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--metrics-seconds", type=float, default=1.0)
    parser.add_argument("--checkpoint-seconds", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--crash-on", choices=("none", "checkpoint", "warning"), default="none")
    parser.add_argument("--max-steps", type=int, default=0, help="0 = run until signalled")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 <= args.util_pct <= 100:
        parser.error(f"--util-pct must be in 0..100, got {args.util_pct}")
    if args.step_seconds <= 0:
        parser.error("--step-seconds must be > 0")
    return args


def log(message: str) -> None:
    print(f"[toy_trainer {os.getpid()}] {message}", file=sys.stderr, flush=True)


def write_json_atomically(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def load_model(path: Path) -> Model:
    if not path.exists():
        return Model()
    data = json.loads(path.read_text())
    return Model(w=float(data["w"]), b=float(data["b"]), step=int(data["step"]))


def train_for(model: Model, seconds: float, rng: random.Random) -> float:
    """SGD steps until `seconds` of busy time have passed; returns the last loss."""
    deadline = time.perf_counter() + seconds
    loss = 0.0
    while True:
        x = rng.uniform(-1.0, 1.0)
        error = model.w * x + model.b - (3.0 * x + 1.0 + rng.gauss(0.0, 0.05))
        model.w -= 0.05 * error * x
        model.b -= 0.05 * error
        model.step += 1
        loss = error * error
        if time.perf_counter() >= deadline:
            return loss


def save_checkpoint(model: Model, path: Path, slow_seconds: float) -> None:
    time.sleep(slow_seconds)  # stands in for writing optimizer state to slow storage
    write_json_atomically(path, {"w": model.w, "b": model.b, "step": model.step, "saved_at": time.time()})


def acknowledge(path: Path, model: Model) -> None:
    request = path.with_name(path.name + ".request")
    token = request.read_text().strip() if request.exists() else ""
    write_json_atomically(
        path.with_name(path.name + ".done"), {"token": token, "step": model.step, "ts": time.time()}
    )


def install_handlers(flags: Flags, ignore_sigterm: bool) -> None:
    signal.signal(signal.SIGUSR1, lambda *_: setattr(flags, "warned", True))
    signal.signal(signal.SIGUSR2, lambda *_: setattr(flags, "checkpoint_requested", True))
    if ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: setattr(flags, "terminate", True))


def run(args: argparse.Namespace) -> int:
    flags = Flags()
    install_handlers(flags, args.ignore_sigterm)
    args.checkpoint.parent.mkdir(parents=True, exist_ok=True)
    model = load_model(args.checkpoint)
    rng = random.Random(args.seed)
    metrics = args.metrics.open("a", buffering=1) if args.metrics else None
    saved_step = model.step
    window_start, busy, loss, warned_logged = time.time(), 0.0, 0.0, False
    log(f"started at step {model.step}")
    while True:
        busy_target = args.step_seconds * args.util_pct / 100.0
        began = time.perf_counter()
        loss = train_for(model, busy_target, rng) if busy_target > 0 else loss
        busy += time.perf_counter() - began
        time.sleep(max(0.0, args.step_seconds - busy_target))
        if flags.warned and not warned_logged:
            warned_logged = True
            log("pre-drain warning received")
            if args.crash_on == "warning":
                os._exit(CRASH_EXIT_CODE)
        now = time.time()
        if metrics is not None and now - window_start >= args.metrics_seconds:
            util = min(100.0, 100.0 * busy / max(now - window_start, 1e-9))
            metrics.write(
                json.dumps(
                    {
                        "ts": now,
                        "util_pct": round(util, 2),
                        "step": model.step,
                        "loss": loss,
                        "warned": flags.warned,
                    }
                )
                + "\n"
            )
            window_start, busy = now, 0.0
        if flags.checkpoint_requested:
            flags.checkpoint_requested = False
            if args.crash_on == "checkpoint":
                log("crashing on checkpoint request")
                os._exit(CRASH_EXIT_CODE)
            save_checkpoint(model, args.checkpoint, args.checkpoint_seconds)
            saved_step = model.step
            acknowledge(args.checkpoint, model)
            log(f"checkpoint at step {model.step}")
        if flags.terminate or (args.max_steps and model.step >= args.max_steps):
            if saved_step != model.step:
                save_checkpoint(model, args.checkpoint, args.checkpoint_seconds)
            log(f"exiting at step {model.step} (terminate={flags.terminate})")
            return 0


def main(argv: list[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
