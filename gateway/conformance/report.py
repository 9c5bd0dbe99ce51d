"""The kit's reports: the human table (grouped by era and section, with a summary line), JUnit XML for
CI systems (one testcase per check and era) and JSON for tools. All three are pure functions of the
results. An `info` result is neither a pass nor a failure: the table and JSON show what it saw."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any
from xml.etree import ElementTree

from gateway.conformance.registry import Result
from gateway.protocol.era import Era

MARKS = {"pass": "PASS", "fail": "FAIL", "skip": "skip", "info": "info"}


def counts(results: Sequence[Result]) -> Counter[str]:
    return Counter(result.status for result in results)


def summary(results: Sequence[Result]) -> str:
    tally = counts(results)
    return f"{tally['pass']} passed, {tally['fail']} failed, {tally['skip']} skipped, {tally['info']} info"


def table(results: Sequence[Result], *, evidence: bool = True) -> str:
    """One line per check, under an era and section heading; a failure's evidence follows it, indented."""
    lines: list[str] = []
    era: Era | None = None
    section: str | None = None
    width = max((len(result.check.id) for result in results), default=0)
    for result in results:
        if result.era != era:
            era, section = result.era, None
            lines += [""] if lines else []
            lines.append(f"{era.value} ({era.label})")
        if result.check.section != section:
            section = result.check.section
            lines.append(f"  {section}")
        lines.append(f"    {MARKS[result.status]}  {result.check.id:<{width}}  {result.reason}".rstrip())
        if evidence and result.status == "fail":
            lines += [f"          {json.dumps(entry, ensure_ascii=False)}" for entry in result.evidence]
    lines += ["", summary(results)]
    return "\n".join(lines)


def as_json(target: str, results: Sequence[Result]) -> dict[str, Any]:
    tally = counts(results)
    return {
        "target": target,
        "summary": {"passed": tally["pass"], "failed": tally["fail"], "skipped": tally["skip"], "info": tally["info"]},
        "results": [
            {
                "id": result.check.id,
                "era": result.era.label,
                "protocolVersion": result.era.value,
                "section": result.check.section,
                "level": result.check.level,
                "sentence": result.check.sentence,
                "status": result.status,
                "reason": result.reason,
                "evidence": result.evidence,
            }
            for result in results
        ],
    }


def junit(target: str, results: Sequence[Result]) -> str:
    """JUnit XML: a testsuite per era, a testcase per check (`classname` = era and section)."""
    suites = ElementTree.Element("testsuites", name=f"SEP-2694 conformance of {target}")
    for era in dict.fromkeys(result.era for result in results):
        mine = [result for result in results if result.era == era]
        tally = counts(mine)
        suite = ElementTree.SubElement(
            suites,
            "testsuite",
            name=f"sep-2694 {era.value}",
            tests=str(len(mine)),
            failures=str(tally["fail"]),
            skipped=str(tally["skip"]),
            errors="0",
        )
        for result in mine:
            case = ElementTree.SubElement(
                suite, "testcase", classname=f"conformance.{era.label}.{result.check.section}", name=result.check.id
            )
            evidence = json.dumps(result.evidence, ensure_ascii=False, indent=1)
            if result.status == "fail":
                ElementTree.SubElement(case, "failure", message=result.reason).text = evidence
            elif result.status == "skip":
                ElementTree.SubElement(case, "skipped", message=result.reason)
            out = f"{result.check.level}: {result.check.sentence}"
            if result.status == "info":
                out += f"\ninfo: {result.reason}"
            ElementTree.SubElement(case, "system-out").text = out
    ElementTree.indent(suites)
    return ElementTree.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
