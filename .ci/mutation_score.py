"""The mutation score of `make mutate` / `make mutate-full`, per module and overall.

Reads mutmut's verdicts (`mutmut results --all true`) and the equivalent mutants listed in
`.ci/mutation_equivalents.txt` (one `name  # reason` a line; an equivalent mutant changes
nothing a user could observe, so it counts neither way). Killed and timed-out mutants count
as caught; survivors and mutants no test reaches count as missed. `--min 95` exits 1 below
95%, and a listed equivalent that is no longer a survivor is reported (its function changed:
look again).

One class of equivalents is recognised without a list: a mutant that only changes the letter
case of an SQL string (`"SELECT ... AND NOT shadow"` made `"select ... and not shadow"`)
outside its quoted literals ('budget_guard' kept as is). DuckDB's keywords and unquoted
identifiers are case-insensitive, so no query can tell them apart (`sql_case_mutants`, read
from the mutated copies under mutants/).

`--pending GLOB...` prints instead the mutants matching a name glob that are not caught yet
(not run, survived, no tests; equivalents left out): what `make mutate MUTANTS=...` reruns.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import fnmatch
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.txt")
CAUGHT = {"killed", "timeout"}
MISSED = {"survived", "no tests", "suspicious", "segfault"}


def verdicts(mutmut: str) -> dict[str, str]:
    out = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True)
    result = {}
    for line in out.stdout.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep:
            result[name] = status
    return result


def equivalents(path: Path = EQUIVALENTS) -> dict[str, str]:
    listed = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        name, _, reason = line.partition("#")
        if name.strip():
            listed[name.strip()] = reason.strip()
    return listed


SQL_WORDS = re.compile(
    r"\b(SELECT|FROM|WHERE|INSERT|DELETE|UPDATE|JOIN|GROUP BY|ORDER BY|AND|WITH|BEGIN|COMMIT"
    r"|ROLLBACK|CAST|SET)\b",
    re.IGNORECASE,
)


def sql_case_mutants(root: Path = Path("mutants")) -> set[str]:
    """The mutants whose every changed line is an SQL line that differs from the original only
    in letter case outside its '...' literals (mutmut's string-case mutation of a query)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        if "__mutmut_orig" not in text:
            continue
        module = ".".join(path.relative_to(root).with_suffix("").parts)
        # slices of one line list: ast.get_source_segment splits the whole file per call,
        # which on the mutated copies (tens of thousands of lines) took minutes
        lines = text.splitlines()
        bodies = {
            node.name: "\n".join(lines[node.lineno - 1 : node.end_lineno])
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.FunctionDef) and "__mutmut_" in node.name
        }
        for name, body in bodies.items():
            stem, _, number = name.rpartition("__mutmut_")
            original = bodies.get(f"{stem}__mutmut_orig")
            if not number.isdigit() or original is None:
                continue
            diff = difflib.ndiff(original.splitlines()[1:], body.splitlines()[1:])
            changed = [line for line in diff if line[:2] in ("- ", "+ ")]
            old = [line[2:] for line in changed if line[0] == "-"]
            new = [line[2:] for line in changed if line[0] == "+"]
            if old and len(old) == len(new) and all(_same_sql(o, n) for o, n in zip(old, new)):
                found.add(f"{module}.{name}")
    return found


def _same_sql(old: str, new: str) -> bool:
    literals = re.compile(r"'[^']*'")
    return (
        old != new
        and old.lower() == new.lower()
        and bool(SQL_WORDS.search(old))
        and literals.findall(old) == literals.findall(new)
    )


def module_of(name: str) -> str:
    return name.split(".x_", 1)[0].split(".xǁ", 1)[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutmut", default=str(Path(sys.executable).with_name("mutmut")))
    parser.add_argument("--min", type=float, default=None, help="fail below this score (percent)")
    parser.add_argument("--pending", nargs="+", metavar="GLOB", help="print the uncaught mutants matching")
    args = parser.parse_args(argv)
    found, listed = verdicts(args.mutmut), equivalents()
    listed.update(dict.fromkeys(sql_case_mutants() - listed.keys(), "SQL keyword case"))
    if args.pending:
        for name, status in sorted(found.items()):
            if (status in MISSED or status == "not checked") and name not in listed:
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in args.pending):
                    print(name)
        return 0
    per_module: dict[str, Counter] = defaultdict(Counter)
    missed = []
    for name, status in sorted(found.items()):
        if name in listed and status != "not checked":
            status = "equivalent" if status in MISSED else status
        per_module[module_of(name)][status] += 1
        if status in MISSED:
            missed.append(f"{name}: {status}")
    stale = sorted(
        n
        for n, why in listed.items()
        if found.get(n) not in MISSED | {"not checked"} and why != "SQL keyword case"
    )
    print(f"{'module':52} {'caught':>7} {'missed':>7} {'equiv':>6} {'unrun':>6} {'score':>7}")
    total = Counter()
    for module, counts in sorted(per_module.items()):
        total.update(counts)
        print(_row(module, counts))
    print(_row("all scoped modules", total))
    for line in missed:
        print(f"  missed {line}")
    for name in stale:
        print(f"  listed as equivalent but {found.get(name, 'gone')}: {name}")
    caught, scored = _scored(total)
    score = 100.0 * caught / scored if scored else 0.0
    print(
        f"mutation score {score:.1f}%: {caught} of {scored} caught,"
        f" {total['equivalent']} equivalent excluded, {total['not checked']} not run yet"
    )
    if args.min is not None and (score < args.min or total["not checked"]):
        print(f"error: mutation score below {args.min:g}% or mutants left unrun", file=sys.stderr)
        return 1
    return 0


def _scored(counts: Counter) -> tuple[int, int]:
    caught = sum(counts[s] for s in CAUGHT)
    return caught, caught + sum(counts[s] for s in MISSED)


def _row(module: str, counts: Counter) -> str:
    caught, scored = _scored(counts)
    score = f"{100.0 * caught / scored:.1f}%" if scored else "-"
    return (
        f"{module:52} {caught:>7} {scored - caught:>7} {counts['equivalent']:>6}"
        f" {counts['not checked']:>6} {score:>7}"
    )


if __name__ == "__main__":
    sys.exit(main())
