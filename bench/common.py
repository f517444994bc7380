"""Helpers shared by the benchmarks: machine description, results JSON, sections of docs/benchmarks.md.

Every benchmark writes ``bench/results/<name>.json`` (``write_result``) and rewrites its own
section of ``docs/benchmarks.md`` (``update_docs_section``): the text between
``<!-- bench:<name>:begin -->`` and ``<!-- bench:<name>:end -->``, so a re-run replaces only
its own numbers and leaves hand-written text alone. ``targets_section`` reads every results file
and renders the table of targets with the measured value beside each.

Run:
  ``.venv/bin/python -m bench.common targets``   re-render the targets table from bench/results/
  ``.venv/bin/python -m bench.common machine``   print the machine description as JSON
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parent.parent
"""Repository root (benchmarks run from here: ``python -m bench.<name>``)."""
RESULTS_DIR = REPO / "bench" / "results"
"""Where ``<name>.json`` results go."""
DOCS = REPO / "docs" / "benchmarks.md"
"""The benchmark report."""
PLOTS_DIR = REPO / "docs" / "benchmarks"
"""PNG plots referenced from the report."""


# ------------------------------------------------------------------------------------ the machine
def _meminfo_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        return None
    return None


def machine_info() -> dict[str, Any]:
    """Describe the machine a benchmark ran on.

    Returns:
        ``platform``, ``processor``, ``cpu_count``, ``memory_gib``, ``python``, ``torch`` (version,
        when importable), ``gpu`` (the CUDA device name, or None), ``load_avg`` (1, 5, 15 minute
        load averages: runnable processes, which on this shared machine include other people's
        work) and ``when`` (UTC, ISO 8601).
    """
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _meminfo_gib(),
        "python": platform.python_version(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info["torch"], info["gpu"] = None, None
    return info


ENGINE_MODES = ("lockstep", "continuous", "groups")
"""The feedings ``bench.async_vs_sync.measure_engine_modes`` times and ``bench.simulate`` replays: synchronous
GRPO's, SAO's and asynchronous GRPO's (results from before ``groups`` have the first two)."""
GROUP_FEED_SIZE = 8
"""Episodes per group of the ``groups`` feeding (asynchronous GRPO's G in the benchmark); results that do not
record their ``group_size`` used it."""


BUSY_FIELDS = (0, 1, 2, 5, 6)
"""Fields of ``/proc/stat``'s ``cpu`` line that count as busy: user, nice, system, irq, softirq (idle, iowait and steal are not)."""


def busy_cpu_seconds(stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds every process of the machine has spent busy since boot (``BUSY_FIELDS``), or None off Linux.

    Raises:
        ValueError: ``stat`` exists but its first line is not an aggregate ``cpu`` line.
    """
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        raise ValueError(f"{stat}: first line is not the aggregate 'cpu' line: {' '.join(first[:3])!r}")
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(first[1 + i]) for i in BUSY_FIELDS) / ticks


class OtherCpu:
    """Context manager: how many cores processes other than this one kept busy while its block ran.

    ``cores = max(0, (busy CPU seconds of the machine - this process's CPU seconds) / wall seconds)``
    over the block (``busy_cpu_seconds``; ``time.process_time`` counts every thread of this
    process, not its children). Unlike the 1-minute load average it does not lag: right after a
    benchmark's worker processes exit, the load average still counts them for a minute, this does
    not. ``cores`` is None off Linux or when the block took no measurable time.
    """

    def __init__(self) -> None:
        self.cores: float | None = None
        self._start: tuple[float, float | None, float] = (0.0, None, 0.0)

    def __enter__(self) -> OtherCpu:
        self._start = (time.monotonic(), busy_cpu_seconds(), time.process_time())
        return self

    def __exit__(self, *exc: object) -> None:
        wall0, busy0, own0 = self._start
        wall, busy, own = time.monotonic() - wall0, busy_cpu_seconds(), time.process_time() - own0
        if busy0 is None or busy is None or wall <= 0:
            return
        self.cores = max(0.0, (busy - busy0 - own) / wall)


def machine_line(info: dict[str, Any]) -> str:
    """One Markdown line describing ``info`` (from ``machine_info``)."""
    load = info.get("load_avg") or []
    gpu = info.get("gpu") or "no GPU"
    return (
        f"Machine: {info.get('platform')}, {info.get('cpu_count')} CPU cores, {info.get('memory_gib')} GiB, "
        f"{gpu}, Python {info.get('python')}, torch {info.get('torch')}; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.1f}' for x in load)} at the end of the run ({info.get('when')})."
    )


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """The command that reproduces a run: ``.venv/bin/python -m <module> <args>``."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([".venv/bin/python -m", module, *args]).strip()


Method = Literal["sao", "grpo_async", "grpo_sync"]
"""The kinds of method the benchmarks compare."""


def method_kind(method: str) -> Method:
    """The kind of a measured method: ``sao`` and its capacity-sweep runs (``sao tau=6 slots=384``) -> ``sao``,
    ``grpo_sync_g<G>`` -> ``grpo_sync``, other GRPO -> ``grpo_async``."""
    if method == "sao" or method.startswith("sao "):
        return "sao"
    return "grpo_sync" if method.rpartition("_g")[0] == "grpo_sync" else "grpo_async"

# ------------------------------------------------------------------------------- results and docs
def settings_of(args: Any) -> dict[str, Any]:
    """An argparse namespace as JSON-ready settings; paths inside the repository are written relative to it.

    Results are committed, so they must not carry the path of the machine that ran them.
    """
    out: dict[str, Any] = {}
    for key, value in vars(args).items():
        if isinstance(value, Path):
            resolved = value.resolve()
            value = str(resolved.relative_to(REPO)) if resolved.is_relative_to(REPO) else value.name
        out[key] = value
    return out


def point_label(tau: int, slots: int, keep: bool) -> str:
    """The method label of an ``async_vs_sync`` capacity-sweep point's runs: ``sao tau=<tau> slots=<slots>`` (+ `` keep``)."""
    return f"sao tau={tau} slots={slots}" + (" keep" if keep else "")


LATER_DEFAULTS = {"keep_stale_episodes": True}
"""``async_vs_sync`` arguments added after results were stored, with what those results ran: before
generators cancelled stale episodes in flight, every episode ran to its end."""


def stored_settings(target: dict[str, Any]) -> dict[str, Any]:
    """A stored ``async_vs_sync`` setting's arguments, with ``LATER_DEFAULTS`` for the keys it predates."""
    return {**LATER_DEFAULTS, **(target.get("settings") or {})}


def write_result(name: str, data: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write ``data`` as indented JSON to ``<results_dir>/<name>.json``; return the path.

    Objects are indented one key per line; a list holding no object is written compactly, on one
    line when its items are scalars, else one line per item (one per timed batch or recorded
    episode: ``json.dumps(indent=2)`` gave every number its own line and doubled the file).

    Raises:
        TypeError: ``data`` holds something JSON cannot encode.
    """
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{name}.json"
    path.write_text(readable_json(data) + "\n", encoding="utf-8")
    return path


def readable_json(value: Any, indent: int = 0) -> str:
    """``value`` as JSON laid out as ``write_result`` describes (``json.loads`` reads it back unchanged).

    Raises:
        TypeError: ``value`` holds something JSON cannot encode.
    """
    pad, inner = " " * indent, " " * (indent + 2)
    if isinstance(value, dict) and value:
        # a non-string key is written as json.dumps writes it (4 -> "4", True -> "true")
        items = [f"{inner}{json.dumps(k if isinstance(k, str) else json.dumps(k))}: {readable_json(v, indent + 2)}"
                 for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(value, list | tuple) and value:
        if not any(_holds_object(v) for v in value):
            if not any(isinstance(v, list | tuple) for v in value):
                return json.dumps(value)
            return "[\n" + ",\n".join(inner + json.dumps(v) for v in value) + f"\n{pad}]"
        return "[\n" + ",\n".join(inner + readable_json(v, indent + 2) for v in value) + f"\n{pad}]"
    return json.dumps(value)


def _holds_object(value: Any) -> bool:
    if isinstance(value, dict):
        return True
    return isinstance(value, list | tuple) and any(_holds_object(v) for v in value)


def read_result(name: str, results_dir: Path = RESULTS_DIR) -> dict[str, Any] | None:
    """The parsed ``<results_dir>/<name>.json``, or None when the benchmark has not been run."""
    path = results_dir / f"{name}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A Markdown table; ``align`` holds one of ``l``/``r`` per column (default: first left, rest right).

    Raises:
        ValueError: a row or ``align`` whose length differs from ``headers``.
    """
    n = len(headers)
    align = align or ("l" + "r" * (n - 1))
    if len(align) != n:
        raise ValueError(f"align: expected {n} characters, got {align!r}")
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    for i, row in enumerate(rows):
        if len(row) != n:
            raise ValueError(f"rows[{i}]: expected {n} cells, got {len(row)}")
        lines.append("| " + " | ".join(str(c) for c in row) + " |")
    return "\n".join(lines)


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def update_docs_section(name: str, markdown: str, docs: Path = DOCS) -> Path:
    """Replace the generated section ``name`` of ``docs`` with ``markdown`` (appended when absent).

    The section is the text between ``<!-- bench:<name>:begin -->`` and ``<!-- bench:<name>:end -->``;
    text outside the markers is kept as it is.

    Raises:
        ValueError: ``docs`` has a begin marker without its end marker (or the reverse).
    """
    begin, end = _markers(name)
    text = docs.read_text(encoding="utf-8") if docs.exists() else "# Benchmarks\n"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    has_begin, has_end = begin in text, end in text
    if has_begin != has_end:
        raise ValueError(f"{docs}: section {name!r} has only one of its markers {begin!r} / {end!r}")
    if has_begin:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    docs.parent.mkdir(parents=True, exist_ok=True)
    docs.write_text(text, encoding="utf-8")
    return docs


# ------------------------------------------------------------------------------------- targets
def _fmt(x: float | None, digits: int = 2) -> str:
    return "not measured" if x is None else f"{x:.{digits}f}"


def targets_rows(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """The issue's targets with the measured value of each, from the results files.

    Returns:
        One dict per target: ``target`` (text), ``measured`` (float or None when the benchmark has
        not written its result), ``met`` (bool or None), ``source`` (results file).
    """
    rows: list[dict[str, Any]] = []

    def add(target: str, measured: float | None, ok: bool | None, source: str) -> None:
        rows.append({"target": target, "measured": measured, "met": ok, "source": source})

    avs = read_result("async_vs_sync", results_dir)
    busy = (avs or {}).get("busy_fraction", {}).get("sao")
    add("SAO generator busy fraction >= 0.9 (long-tailed setting)", busy, None if busy is None else busy >= 0.9,
        "async_vs_sync.json: busy_fraction.sao")
    ratio = (avs or {}).get("throughput_ratio_sao_over_grpo_sync")
    add("SAO trained-token throughput >= 1.5x synchronous GRPO (same setting)", ratio,
        None if ratio is None else ratio >= 1.5, "async_vs_sync.json: throughput_ratio_sao_over_grpo_sync")
    stream = read_result("stream", results_dir)
    q = min((r["ratio_ours_over_raw"] for r in (stream or {}).get("rows", [])), default=None)
    add("Queue throughput >= 0.5x the raw XADD/XREAD loop (worst size)", q, None if q is None else q >= 0.5,
        "stream.json: min rows[].ratio_ours_over_raw")
    ws = read_result("weight_sync", results_dir)
    w = (ws or {}).get("worst_ratio_over_raw")
    add("Weight-sync latency <= 2x the raw safetensors write + read (worst model)", w, None if w is None else w <= 2.0,
        "weight_sync.json: worst_ratio_over_raw")
    sim = read_result("simulate", results_dir)
    e = (sim or {}).get("validation", {}).get("max_abs_relative_error")
    add("Simulator within 15% of the measured small runs (worst quantity)", e, None if e is None else e <= 0.15,
        "simulate.json: validation.max_abs_relative_error")
    return rows


def targets_section(results_dir: Path = RESULTS_DIR) -> str:
    """The Markdown table of targets (``targets_rows``) for docs/benchmarks.md."""
    table = markdown_table(
        ["target", "measured", "met?", "from"],
        [
            [r["target"], _fmt(r["measured"]), {True: "yes", False: "**no**", None: "-"}[r["met"]], f"`{r['source']}`"]
            for r in targets_rows(results_dir)
        ],
        align="lrll",
    )
    return (
        "Re-rendered from `bench/results/*.json` by `.venv/bin/python -m bench.common targets` "
        "(each benchmark also re-renders it).\n\n" + table
    )


def refresh_targets(results_dir: Path = RESULTS_DIR, docs: Path = DOCS) -> Path:
    """Rewrite the ``targets`` section of ``docs`` from ``results_dir``."""
    return update_docs_section("targets", targets_section(results_dir), docs)


def publish_result(
    name: str,
    data: dict[str, Any],
    markdown: str,
    *,
    docs: bool,
    shown: str | None = None,
    results_dir: Path = RESULTS_DIR,
    docs_path: Path = DOCS,
) -> Path:
    """A benchmark's last step: write its JSON, rewrite its docs section and the targets, print it.

    Args:
        name: Benchmark name (``bench/results/<name>.json``, docs markers ``bench:<name>``).
        data: The result to write.
        markdown: The rendered section (printed; written into the docs when ``docs``).
        docs: Whether to rewrite ``docs/benchmarks.md`` (False for ``--no-docs``).
        shown: What to print instead of ``markdown`` (e.g. only this run of a merged section).
        results_dir: Where the JSON goes.
        docs_path: The benchmarks page.

    Returns:
        The JSON path.
    """
    path = write_result(name, data, results_dir)
    if docs:
        update_docs_section(name, markdown, docs_path)
        refresh_targets(results_dir, docs_path)
    print(markdown if shown is None else shown)
    print(f"\nWrote {path}")
    return path


def main(argv: list[str] | None = None) -> int:
    """Command-line entry (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("targets", help="re-render the targets section of docs/benchmarks.md")
    sub.add_parser("machine", help="print the machine description")
    args = parser.parse_args(argv)
    if args.cmd == "targets":
        print(refresh_targets())
        return 0
    print(json.dumps(machine_info(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
