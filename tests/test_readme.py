"""The README in step with the program: its command summary names exactly the options each command's --help
has, its scenario list is the simulator's, and its examples are in the shapes the program prints."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from collectors.sim.scenarios import SCENARIOS
from optimizer.commands.cli import build_parser

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z-]*")


def _block(after: str) -> str:
    section = README[README.index(after) :]
    start = section.index("```") + len(section[section.index("```") :].split("\n", 1)[0]) + 1
    return section[start : section.index("\n```", start)]


def _parser_options() -> dict[str, set[str]]:
    """Each command's options as its --help lists them (a group's verbs' options under the group's name)."""
    out: dict[str, set[str]] = {}
    subparsers = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    for name, parser in subparsers.choices.items():
        found: set[str] = set()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for verb in action.choices.values():
                    found |= {o for a in verb._actions for o in a.option_strings}
            found |= set(action.option_strings)
        out[name] = found - {"-h", "--help", "--version", "--log-level"}  # every command's, on the first line
    return out


def _readme_options() -> dict[str, set[str]]:
    """Each command's options as the README's summary names them (its lines and the notes beside them)."""
    out: dict[str, set[str]] = {}
    command = None
    for line in _block("## Commands").splitlines():
        if line.startswith("fleetfit "):
            word = line.split()[1]
            command = None if word.startswith("[") else word
        if command is not None:
            out.setdefault(command, set()).update(OPTION.findall(line))
    return out


def test_the_command_summary_names_every_option_of_every_command_and_no_other() -> None:
    parser, readme = _parser_options(), _readme_options()
    assert set(readme) == set(parser), "commands: README has " + ", ".join(sorted(set(readme) ^ set(parser)))
    for command, options in parser.items():
        assert readme[command] == options, (
            f"{command}: only in --help {sorted(options - readme[command])}, "
            f"only in the README {sorted(readme[command] - options)}"
        )
    first = _block("## Commands").splitlines()[0]
    assert "--version" in first and "--log-level" in first  # the global options


def test_the_scenarios_listed_are_the_simulators() -> None:
    line = README[README.index("Scenarios: ") :].split("(", 1)[0]
    assert re.findall(r"`([a-z-]+)`", line) == list(SCENARIOS)


def test_the_examples_are_in_the_shapes_the_program_prints() -> None:
    demo = _block("The final plan's actions, from `make demo`").splitlines()
    assert re.fullmatch(
        r"recommended actions, saving \$[\d,]+/month \((\w[\w-]* \$[\d,]+(, )?)+\), in \d+ wave\(s\) "
        r"\(a wave's actions run in parallel\):",
        demo[0],
    )
    actions = [line for line in demo if re.match(r"\s+\d+\. ", line)]
    assert actions and all(
        re.fullmatch(r"\s+\d+\. (move|reclaim|right-size|consolidate) [\w-]+: .+  \$[\d,]+/month", a) for a in actions
    )
    assert any(re.fullmatch(r"\s+waits for #\d+(, #\d+)*", line) for line in demo)
    report = _block("From another terminal during `make demo`").splitlines()
    assert re.fullmatch(
        r"GPU use and waste per owner since \d{4}-\d\d-\d\d \d\d:\d\d UTC, over the \d+ (s|min|h|days) the optimizer "
        r"watched \(time it was down and replayed history are not charged\)",
        report[2],
    )
    assert report[3].split()[:2] == ["OWNER", "WORKLOADS"] and report[3].endswith("SAVINGS $/MONTH")
    assert max(len(line) for line in report[3:]) <= 120  # the table fits a terminal without --wide
