"""Run every benchmark in bench/ and rewrite its generated sections.

    python bench/run_all.py [--quick | --full] [--only NAME ...] [--timeout S] [--dry-run]

Each other script `bench/NAME.py` (not starting with "_") runs with `--quick` (default) or at
full size (`--full`: no flag, each script's own default). Its output streams through to the
terminal; its `FIGURE name value` lines and its markdown (headings and tables) are kept and
written between `<!-- bench:begin NAME -->` and `<!-- bench:end NAME -->` in bench/RESULTS.md,
with the date, the machine (the CPU's model name and vector extensions) and the command.
Everything outside the markers is left as it is; a script with no markers yet gets a new
section at the end. A script that fails keeps its previous section, marked as failed, and
run_all exits non-zero at the end. After each script, the `figures` section of bench/README.md
is rebuilt from RESULTS.md: every script's FIGURE values, one row each, with its run's date.

Not run one by one: generate.py (the engine_*.py scripts together, for `rag bench-engine`),
and gpu_check.py where there is no CUDA device (its section is kept).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "RESULTS.md"
README = BENCH / "README.md"
# A figure's name and value; words after the value (a standard error) stay in the output only.
FIGURE = re.compile(r"^FIGURE\s+(\S+)\s+(\S+)(\s.*)?$")
FIGURE_ROW = re.compile(r"^\| `([^`]+)` \| (.*?) \|$", re.MULTILINE)
# Tools rather than benchmarks: no figures, and evidence.py and train_evidence.py need a data
# dir `answers.py --keep` left.
NOT_RUN = ("run_all.py", "generate.py", "evidence.py", "train_evidence.py")
GPU_ONLY = ("gpu_check",)


@dataclass
class Run:
    name: str
    command: list[str]
    returncode: int = 0
    seconds: float = 0.0
    figures: list[tuple[str, str]] = field(default_factory=list)
    markdown: list[str] = field(default_factory=list)


def scripts(folder: Path, only: list[str] | None) -> list[Path]:
    found = [
        p
        for p in sorted(folder.glob("*.py"))
        if not p.name.startswith("_") and p.name not in NOT_RUN
    ]
    if only:
        missing = set(only) - {p.stem for p in found}
        if missing:
            raise SystemExit(f"no such benchmark: {', '.join(sorted(missing))}")
        found = [p for p in found if p.stem in only]
    return found


def markdown_of(lines: list[str]) -> list[str]:
    """Headings (one level down, under the script's own heading) and tables from a script's
    output, each table with the first text line after it (its caption), in order."""
    out: list[str] = []
    in_table = after_table = False
    for line in lines:
        stripped = line.rstrip()
        if stripped.startswith("|"):
            if not in_table and out and out[-1] != "":
                out.append("")
            out.append(stripped)
            in_table, after_table = True, False
            continue
        if in_table:
            in_table, after_table = False, True
        if stripped.startswith("#"):
            if out and out[-1] != "":
                out.append("")
            out += ["#" + stripped, ""]
            after_table = False
        elif after_table and stripped:
            if not stripped.startswith(("FIGURE", "<!--", " ")):
                out += ["", stripped]
            after_table = False
    while out and out[-1] == "":
        out.pop()
    return out


def run_script(path: Path, full: bool, timeout: float | None) -> Run:
    command = [sys.executable, str(path)] + ([] if full else ["--quick"])
    run = Run(path.stem, command)
    print(f"\n=== {path.name} {'(full)' if full else '--quick'}", flush=True)
    t = time.perf_counter()
    lines: list[str] = []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(
        command, cwd=BENCH.parent, stdout=subprocess.PIPE, text=True, env=env
    ) as proc:
        assert proc.stdout is not None
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer is not None:
            timer.start()
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                lines.append(line.rstrip("\n"))
            run.returncode = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
    run.seconds = time.perf_counter() - t
    run.figures = [(m[1], m[2]) for m in (FIGURE.match(x) for x in lines) if m]
    run.markdown = markdown_of(lines)
    return run


def cpu_kind() -> str:
    """lscpu's model name, and the vector extensions the engine's kernels choose by (the
    figures of a CPU without them are not those of one with them)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                name = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    except (OSError, subprocess.CalledProcessError):
        pass
    named = [("amx_tile", "AMX"), ("avx512_bf16", "AVX512-BF16"), ("avx512_vnni", "AVX512-VNNI")]
    have = [label for flag, label in named if flag in flags]
    if not have and "avx2" in flags:
        have = ["AVX2 only"]
    return f"{name} ({', '.join(have)})" if have else name


def has_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def machine() -> str:
    gpu = "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return (
        f"{cpu_kind()}, {os.cpu_count()} logical CPUs, {gpu}; "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def section(run: Run, stamp: str, where: str, previous: str | None) -> str:
    mode = "--full" if "--quick" not in run.command else "--quick"
    lines = [
        f"_Generated by `bench/run_all.py {mode}` on {stamp} ({run.seconds:.0f} s)._  ",
        f"_Machine: {where}._",
        "",
    ]
    if run.returncode != 0:
        lines += [f"**Last run failed (exit code {run.returncode}); previous results below.**", ""]
        if previous:
            lines.append(previous.strip())
        return "\n".join(lines)
    lines += run.markdown
    if run.figures:
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| `{name}` | {value} |" for name, value in run.figures]
    return "\n".join(lines)


def rewrite(readme: str, name: str, body: str) -> str:
    begin, end = f"<!-- bench:begin {name} -->", f"<!-- bench:end {name} -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    block = f"{begin}\n{body}\n{end}"
    if pattern.search(readme):
        return pattern.sub(lambda _: block, readme, count=1)
    return readme.rstrip("\n") + f"\n\n## {name}\n\n{block}\n"


def previous_body(readme: str, name: str) -> str | None:
    begin, end = f"<!-- bench:begin {name} -->", f"<!-- bench:end {name} -->"
    m = re.search(re.escape(begin) + r"\n(.*?)\n?" + re.escape(end), readme, re.DOTALL)
    if m is None:
        return None
    # Drop the old stamp lines and failure notes: only the results carry over.
    kept = [
        x for x in m.group(1).splitlines() if not x.startswith(("_Generated", "_Machine", "**Last"))
    ]
    return "\n".join(kept)


def section_body(text: str, name: str) -> str | None:
    begin, end = f"<!-- bench:begin {name} -->", f"<!-- bench:end {name} -->"
    m = re.search(re.escape(begin) + r"\n(.*?)\n?" + re.escape(end), text, re.DOTALL)
    return None if m is None else m.group(1)


def run_of(body: str) -> tuple[str, str]:
    """(how and when a section was run, on which CPU) from its stamp lines."""
    stamp = next((x for x in body.splitlines() if x.startswith("_Generated")), "")
    date = re.search(r"\d{4}-\d{2}-\d{2}", stamp)
    how = "--quick" if "--quick" in stamp else "full size"
    if "**Last run failed" in body:
        how += ", last run failed"
    where = next((x for x in body.splitlines() if x.startswith("_Machine: ")), "")
    cpu = re.sub(r", \d+ logical CPUs.*|\._?$", "", where.removeprefix("_Machine: "))
    return (f"{how}, {date.group(0)}" if date else how), cpu


def figures_table(results: str, names: list[str], cpu: str) -> str:
    """Every script's FIGURE values from the results file, one row each."""
    lines = [
        f"_Rebuilt by `bench/run_all.py` from [RESULTS.md](RESULTS.md), where each script's "
        f"tables are. CPU kind: {cpu}; a run on another CPU names it._",
        "",
        "| script | run | figure | value |",
        "|---|---|---|---|",
    ]
    for name in names:
        body = section_body(results, name)
        if body is None:
            lines.append(f"| `{name}` | not run yet | | |")
            continue
        when, where = run_of(body)
        if where and where != cpu:
            when += f", {where}"
        link = f"[{name}](RESULTS.md#{name})"
        found = FIGURE_ROW.findall(body) or [("(tables only)", "")]
        for i, (figure, value) in enumerate(found):
            label = f"`{figure}`" if value else figure
            lines.append(
                f"| {link if i == 0 else ''} | {when if i == 0 else ''} | {label} | {value} |"
            )
    return "\n".join(lines)


def write_figures(readme: Path, results: str, names: list[str], cpu: str) -> None:
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    readme.write_text(rewrite(text, "figures", figures_table(results, names, cpu)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small settings (the default)")
    size.add_argument("--full", action="store_true", help="each script at full size")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="just these scripts")
    parser.add_argument("--timeout", type=float, help="seconds per script before it is killed")
    parser.add_argument(
        "--results",
        "--readme",
        dest="results",
        default=str(RESULTS),
        help="the markdown file whose sections are rewritten (--readme: its earlier name)",
    )
    parser.add_argument(
        "--figures",
        help="the file whose `figures` section is rebuilt from the results "
        "(default: bench/README.md when --results is bench/RESULTS.md)",
    )
    parser.add_argument("--dir", default=str(BENCH), help="where the scripts are")
    parser.add_argument("--dry-run", action="store_true", help="print the sections, do not write")
    args = parser.parse_args(argv)

    results_path = Path(args.results)
    figures_path = Path(args.figures) if args.figures else None
    if figures_path is None and results_path.resolve() == RESULTS:
        figures_path = README
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where, cpu = machine(), cpu_kind()
    every = [p.stem for p in scripts(Path(args.dir), None)]
    failed = []
    for path in scripts(Path(args.dir), args.only):
        if path.stem in GPU_ONLY and not has_cuda():
            print(f"\n=== {path.name}: skipped, no CUDA device here (its section is kept)")
            continue
        run = run_script(path, args.full, args.timeout)
        text = results_path.read_text() if results_path.exists() else "# Benchmark results\n"
        body = section(run, stamp, where, previous_body(text, run.name))
        text = rewrite(text, run.name, body)
        if args.dry_run:
            print(f"\n--- {results_path} section {run.name} ---\n{body}")
        else:
            # Written after each script, so a long run that is stopped keeps what it measured.
            results_path.write_text(text)
            if figures_path is not None:
                write_figures(figures_path, text, every, cpu)
        if run.returncode != 0:
            failed.append(run.name)
    print(f"\n{results_path}: {'dry run, not written' if args.dry_run else 'rewritten'}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
