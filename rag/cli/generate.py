"""`rag generate` (stream a completion from the engine) and `rag bench-engine`."""

from __future__ import annotations

import argparse
import asyncio
import runpy
import sys
from pathlib import Path
from typing import Any

from rag.cli.common import load_settings
from rag.engine.config import EngineSettings
from rag.engine.sequence import SamplingParams


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser("generate", help="stream a completion from the generator engine")
    gen.add_argument("prompt")
    gen.add_argument("--system", default=None, help="system message (chat mode)")
    gen.add_argument("--raw", action="store_true", help="no chat template: plain completion")
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[])
    _engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    bench = subparsers.add_parser(
        "bench-engine", help="run bench/generate.py (arguments are passed through)"
    )
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench_engine)


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=["local", "remote"], default=None)
    p.add_argument("--model-path", default=None, help="GGUF file or safetensors folder")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--remote-url", default=None)
    p.add_argument("--remote-model", default=None)


def settings_from_args(args: argparse.Namespace) -> EngineSettings:
    """Flags over the configured engine settings."""
    base = load_settings().engine
    overrides = {
        k: v
        for k in ("backend", "model_path", "device", "threads", "remote_url", "remote_model")
        if (v := getattr(args, k, None)) is not None
    }
    return base.model_copy(update=overrides)


def cmd_generate(args: argparse.Namespace) -> int:
    from rag.engine.build import build_engine

    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.seed, stop=tuple(args.stop),
    )  # fmt: skip
    prompt: Any = args.prompt
    if not args.raw:
        prompt = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
    engine = build_engine(settings_from_args(args))

    async def run() -> None:
        async for ev in engine.submit(prompt, params):
            sys.stdout.write(ev.text)
            sys.stdout.flush()
            if ev.finish_reason is not None and ev.usage:
                u = ev.usage
                print(
                    f"\n[{ev.finish_reason.value}: {u.prompt_tokens} prompt tokens "
                    f"({u.cached_prompt_tokens} cached), {u.completion_tokens} generated]",
                    file=sys.stderr,
                )

    try:
        asyncio.run(run())
    finally:
        engine.close()
    return 0


def cmd_bench_engine(args: argparse.Namespace) -> int:
    script = Path(__file__).resolve().parents[2] / "bench" / "generate.py"
    if not script.exists():
        print(f"benchmark script not found: {script}", file=sys.stderr)
        return 2
    argv = sys.argv
    sys.argv = [str(script), *[a for a in args.bench_args if a != "--"]]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        sys.argv = argv
    return 0
