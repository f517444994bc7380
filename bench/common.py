"""Helpers shared by the benchmarks: machine description, results JSON, method configs, docs/benchmarks.md.

A benchmark writes its results under ``bench/results/`` and rewrites its own section of the page, the text between
``<!-- bench:<name>:begin -->`` and ``<!-- bench:<name>:end -->``; ``targets_section`` renders the targets table.

Run: ``.venv/bin/python -m bench.common render`` (every generated section of docs/benchmarks.md and docs/results.md
and the targets, from bench/results/, running no benchmark and redrawing no plot) or ``... targets`` (the targets
alone).
"""

import argparse
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from posttrain.cli import run_with_one_line_errors
from posttrain.config import ConfigError, load_config

REPO = Path(__file__).resolve().parent.parent
"""Repository root (benchmarks run from here: ``python -m bench.<name>``)."""
RESULTS_DIR = REPO / "bench" / "results"
"""Where results files go."""
DOCS = REPO / "docs" / "benchmarks.md"
"""The benchmark report."""


def utc_now() -> str:
    """The time now, UTC, ISO 8601 to the second (``2026-12-01T10:00:00Z``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def seconds(fn: Callable[..., Any], *args: Any) -> float:
    """Wall seconds (``time.perf_counter``) that ``fn(*args)`` took."""
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def machine_info() -> dict[str, Any]:
    """The machine a benchmark ran on: platform, processor, cores, memory (GiB), Python, torch, GPU (or None),
    the 1/5/15 minute load averages (other people's work included) and the time (UTC, ISO 8601)."""
    import torch

    memory = None
    if Path("/proc/meminfo").exists():
        line = next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal:"))
        memory = round(int(line.split()[1]) / 2**20, 1)
    info: dict[str, Any] = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "memory_gib": memory, "python": platform.python_version(),
                            "load_avg": [round(x, 2) for x in os.getloadavg()], "when": utc_now()}
    info["torch"], info["gpu"] = torch.__version__, torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return info


def machine_line(info: dict[str, Any]) -> str:
    """One Markdown line describing ``info`` (``machine_info``): cores, memory, GPU, torch, load, time; the rest
    (platform, Python) stays in the results file."""
    load = info.get("load_avg") or []
    return (f"Machine: {info.get('cpu_count')} CPU cores, {info.get('memory_gib')} GiB, {info.get('gpu') or 'no GPU'}, "
            f"torch {info.get('torch')}; load average {'/'.join(f'{x:.1f}' for x in load)} (1/5/15 min) at the end, "
            f"{info.get('when')}.")


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces a run: ``.venv/bin/python -m <module> <args>``."""
    return " ".join([".venv/bin/python -m", module, *(sys.argv[1:] if argv is None else argv)]).strip()


def display_path(path: Path) -> str:
    """``path`` relative to the repository when inside it (results carry no machine's paths), else as given."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else str(path)


def parser(doc: str, out: Path | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: ``doc``'s first line, ``--out`` (default ``out``) and ``--no-docs``."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--out", type=Path, default=out, help=f"results file (default: {display_path(out) if out else 'per setting'})")
    p.add_argument("--no-docs", action="store_true", help="write the results file only")
    return p


def load_method(bench: str, method: str, overrides: Sequence[str] = (),
                parser: argparse.ArgumentParser | None = None) -> Any:
    """A ``RunConfig``: ``bench/configs/<bench>/base.yaml``, then ``<method>.yaml`` (as overrides), then ``overrides``;
    ``ConfigError`` naming an unknown method or a bad value in one line, or with ``parser`` its ``error`` (exit 2)."""
    def flat(d: dict[str, Any], prefix: str = "") -> list[str]:
        return [x for k, v in d.items() for x in (flat(v, f"{prefix}{k}.") if isinstance(v, dict)
                                                   else [f"{prefix}{k}={json.dumps(v)}"])]

    folder = REPO / "bench" / "configs" / bench
    path = folder / f"{method}.yaml"
    try:
        if method == "base" or not path.is_file():
            known = sorted(p.stem for p in folder.glob("*.yaml") if p.stem != "base")
            raise ConfigError(f"method {method!r}: no {display_path(path)}; known: {', '.join(known)}")
        return load_config(folder / "base.yaml", [*flat(yaml.safe_load(path.read_text(encoding="utf-8"))), *overrides])
    except ValueError as exc:
        if parser is None:
            raise
        parser.error(str(exc).splitlines()[0])


def copy_missing(src: Path, dst: Path) -> None:
    """Copy each file of folder ``src`` that ``dst`` lacks (a tokenizer beside weights that lack it)."""
    for f in src.iterdir():
        if not (dst / f.name).exists():
            shutil.copy2(f, dst / f.name)


def joined(values: Iterable[float]) -> str:
    """``0.17 / 0.19 / 0.22`` (two decimals), or ``-`` when there are none (rewards at the snapshots)."""
    return " / ".join(f"{v:.2f}" for v in values) or "-"


def readable_json(value: Any, indent: int = 0) -> str:
    """``value`` as JSON with objects one key per line and lists holding no object compact: on one line when
    their items are scalars, else one line per item (``json.loads`` reads it back); TypeError for what JSON cannot hold."""
    pad, inner = " " * indent, " " * (indent + 2)

    def holds_object(v: Any) -> bool:
        return isinstance(v, dict) or (isinstance(v, list | tuple) and any(holds_object(x) for x in v))

    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: {readable_json(v, indent + 2)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list | tuple) and any(isinstance(v, dict | list | tuple) for v in value):
        flat = not any(holds_object(v) for v in value)
        return "[\n" + ",\n".join(inner + (json.dumps(v) if flat else readable_json(v, indent + 2)) for v in value) + f"\n{pad}]"
    return json.dumps(value)


def write_result(path: Path, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``path`` as ``readable_json`` (creating its folder); return the path. TypeError as there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(readable_json(data) + "\n", encoding="utf-8")
    return path


def read_json(path: Path) -> dict[str, Any]:
    """A results file, parsed; OSError when it cannot be read, ValueError naming it when it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{display_path(path)}: {exc}") from exc


def read_result(name: str, results_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    """The parsed ``<results_dir>/<name>.json``, or None when the benchmark has not been run."""
    path = results_dir / f"{name}.json"
    return read_json(path) if path.exists() else None


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table, ``align`` ``l`` or ``r`` per column (default ``lrr...``); ValueError for a row of another width."""
    n = len(headers)
    align = align or ("l" + "r" * (n - 1))
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"rows[{i}]: expected {n} cells, got {len(row)}")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def update_docs_section(name: str, markdown: str, docs: Path | None = None) -> Path:
    """Replace the section ``name`` of ``docs`` (between its markers) with ``markdown``, or append it when absent;
    ValueError when ``docs`` has only one of the section's two markers."""
    begin, end, docs = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->", docs or DOCS
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    if (begin in text) != (end in text):
        raise ValueError(f"{docs}: section {name!r} has only one of its markers {begin!r} / {end!r}")
    head, found, rest = text.partition(begin)
    text = head + block + rest.split(end, 1)[1] if found else text.rstrip("\n") + "\n\n" + block + "\n"
    docs.write_text(text, encoding="utf-8")
    return docs


def targets_rows(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """The targets, each with ``target`` (text), ``measured`` (None before its benchmark ran), ``met`` and ``source``."""
    from bench.async_vs_sync import targets

    avs = targets(results_dir / "async_vs_sync")
    stream, ws, sim, gw = (read_result(n, results_dir) or {} for n in ("stream", "weight_sync", "simulate", "gateway"))
    queue = min((r["ratio_ours_over_raw"] for r in stream.get("rows", [])), default=None)
    rows = [("SAO generator busy fraction >= 0.9 (long-tailed setting)", avs["busy"], 0.9, True,
             "async_vs_sync/tool_latency/sao.json: mean runs[].busy_fraction"),
            ("SAO trained-token throughput >= 1.5x synchronous GRPO at equal episodes in flight (long-tailed setting)",
             avs["ratio"], 1.5, True,
             "async_vs_sync/tool_latency/equal/: sao over the faster grpo_sync_g<G>, steady-window trained action tokens/s"),
            ("Queue throughput >= 0.5x the raw XADD/XREAD loop (worst size)", queue, 0.5, True,
             "stream.json: min rows[].ratio_ours_over_raw"),
            ("Weight-sync latency <= 2x the raw safetensors write + read (worst model)", ws.get("worst_ratio_over_raw"),
             2.0, False, "weight_sync.json: worst_ratio_over_raw"),
            ("Simulator within 15% of the measured small runs (worst quantity)", sim.get("validation", {}).get(
                "max_abs_relative_error"), 0.15, False, "simulate.json: validation.max_abs_relative_error"),
            ("Rollout gateway: time per generated token <= 1.2x direct engine calls (worst of 1, 8, 32 episodes)",
             gw.get("worst_ratio"), 1.2, False, "gateway.json: worst_ratio")]
    return [{"target": t, "measured": m, "met": None if m is None else (m >= bound if at_least else m <= bound),
             "source": src} for t, m, bound, at_least, src in rows]


def targets_section(results_dir: Path = RESULTS_DIR) -> str:
    """The Markdown table of targets (``targets_rows``) for docs/benchmarks.md."""
    rows = [[r["target"], "not measured" if r["measured"] is None else f"{r['measured']:.2f}",
             {True: "yes", False: "**no**", None: "-"}[r["met"]], f"`{r['source']}`"] for r in targets_rows(results_dir)]
    return ("From `bench/results/` (`.venv/bin/python -m bench.common targets`; each benchmark re-renders it).\n\n"
            + markdown_table(["target", "measured", "met?", "from"], rows, align="lrll"))


def publish_result(path: Path, data: dict[str, Any], section: str, render: Callable[[], str], *, docs: bool) -> Path:
    """A benchmark's last step: write ``data`` to ``path``; unless ``docs`` is False, rewrite its docs ``section``
    with ``render()`` (called after the write) and the targets, and print the section."""
    write_result(path, data)
    if docs:
        text = render()
        update_docs_section(section, text)
        update_docs_section("targets", targets_section(RESULTS_DIR))
        print(text)
    print(f"\nWrote {display_path(path)}")
    return path


def run_main(prog: str, main: Callable[[], int]) -> None:
    """A benchmark's ``__main__``: exit with ``main()``'s status.

    The project's one-line errors (``posttrain.cli.one_line_error``: ``LearnerStopped``, config errors, an
    unreachable Redis or weight store) and a SIGTERM outside the learner's own handler end it with ``prog: line`` on
    stderr and a non-zero status (``posttrain.cli.run_with_one_line_errors``), as ``posttrain`` does, not a traceback.
    """
    sys.exit(run_with_one_line_errors(prog, main, sigterm=True))


def render_results_page(results_dir: Path = RESULTS_DIR) -> list[str]:
    """Rewrite docs/results.md's generated sections (each ``learning_race`` study, ``gkd_miniature``) and docs/log.md's
    (``longtail_evidence``, the ``learning_race.ON_LOG`` studies) from their results files, running nothing and redrawing no plot; return the section names
    written (a study not yet run is skipped)."""
    from bench import gkd_miniature, learning_race, longtail_evidence

    written = []
    for path in sorted((results_dir / learning_race.NAME).glob("*.json")):
        result = read_json(path)
        text = (learning_race.render_stability(result) if path.stem == "stability"
                else learning_race.render_training(result))
        update_docs_section(f"{learning_race.NAME}_{path.stem}", text, learning_race.docs_for(path.stem))
        written.append(f"{learning_race.NAME}_{path.stem}")
    if (gkd := read_result(gkd_miniature.NAME, results_dir)) is not None:
        update_docs_section(gkd_miniature.NAME, gkd_miniature.render(gkd), gkd_miniature.DOCS)
        written.append(gkd_miniature.NAME)
    evidence = results_dir / longtail_evidence.RESULTS.name
    if any(evidence.glob("*.json")):
        update_docs_section("longtail_evidence", longtail_evidence.render(evidence), longtail_evidence.DOCS)
        written.append("longtail_evidence")
    return written


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("cmd", choices=["targets", "render"])
    if p.parse_args(argv).cmd == "render":
        from bench import async_vs_sync, gateway, learner_ranks, stream, vs_trl, weight_sync
        from bench.sim import project

        update_docs_section("async_vs_sync", async_vs_sync.render())
        for name, module in (("vs_trl", vs_trl), ("stream", stream), ("weight_sync", weight_sync), ("simulate", project),
                             ("learner_ranks", learner_ranks), ("gateway", gateway)):
            if (result := read_result(name)) is not None:
                update_docs_section(name, module.render(result))
        render_results_page()
    print(update_docs_section("targets", targets_section(RESULTS_DIR)))
    return 0


if __name__ == "__main__":
    run_main("bench.common", main)
