"""Every command-line entry point answers --help with exit 0 and says what each flag does and
its default (p2plearn-run has its own tests in tests/launch)."""
from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from p2plearn.bench.__main__ import BENCHES

# (how it is typed, module whose main(argv) it runs, the arguments before --help)
ENTRY_POINTS = [
    ("python -m p2plearn.bench", "p2plearn.bench.__main__", []),
    *[(f"python -m p2plearn.bench {name}", "p2plearn.bench.__main__", [name]) for name in BENCHES],
    ("p2plearn-testbed", "p2plearn.testbed.cli", []),
    *[(f"p2plearn-testbed {command}", "p2plearn.testbed.cli", [command])
      for command in ("up", "down", "status", "exec", "measure")],
    ("python -m p2plearn.topology", "p2plearn.topology.__main__", []),
    *[(f"python -m p2plearn.topology {command}", "p2plearn.topology.__main__", [command])
      for command in ("generate", "check")],
    ("python -m p2plearn.sim.tracking", "p2plearn.sim.tracking", []),
    ("python -m p2plearn.sim.unequal", "p2plearn.sim.unequal", []),
    ("python -m p2plearn.sim.validate", "p2plearn.sim.validate", []),
    ("python -m p2plearn.examples.mnist1d", "p2plearn.examples.mnist1d", []),
]


def undocumented(parser: argparse.ArgumentParser) -> list[str]:
    """The arguments of ``parser`` (and of its subcommands) without help, and the options that
    take a value and have a default that their help does not state."""
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        name = "/".join(action.option_strings) or action.dest
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest for choice in action._choices_actions if choice.help}
            missing += [f"{parser.prog} {command}: no help" for command in action.choices if command not in helped]
            for sub in action.choices.values():
                missing += undocumented(sub)
            continue
        if not action.help:
            missing.append(f"{parser.prog} {name}: no help")
        elif (action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)
              and "default" not in action.help):
            missing.append(f"{parser.prog} {name}: default {action.default!r} not shown")
    return missing


@pytest.mark.parametrize("typed, module, args", ENTRY_POINTS, ids=[typed for typed, _, _ in ENTRY_POINTS])
def test_help_exits_0_and_describes_every_flag_with_its_default(typed, module, args, monkeypatch, capsys):
    parsers = []
    parse_args = argparse.ArgumentParser.parse_args

    def recording(self, *a, **kw):
        parsers.append(self)
        return parse_args(self, *a, **kw)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", recording)
    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main([*args, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and "options:" in out, out
    assert parsers, f"{typed}: no argparse parser"
    assert undocumented(parsers[-1]) == []


def test_bench_lists_its_benchmarks_and_refuses_an_unknown_one(capsys):
    from p2plearn.bench.__main__ import main

    with pytest.raises(SystemExit) as done:
        main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and all(f"  {name} " in out for name in BENCHES), out
    with pytest.raises(SystemExit) as done:
        main(["nosuch"])
    assert done.value.code == 2
    assert "argument NAME: invalid choice: 'nosuch'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main([])
    assert done.value.code == 2


@pytest.mark.parametrize("argv", [["-m", "p2plearn.bench", "--help"], ["-m", "p2plearn.topology", "--help"],
                                  ["-m", "p2plearn.testbed", "--help"], ["-m", "p2plearn.bench", "sim", "--help"]],
                         ids=" ".join)
def test_help_as_typed_exits_0(argv):
    """The modules as a user runs them (``python -m``), not only their main()."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and done.stderr == ""
