"""A ``hecate.cli`` plugin that fails to load breaks only its own command."""

from __future__ import annotations

import argparse
from importlib.metadata import EntryPoint

import pytest

from hecate.cli.main import EXIT_USAGE, PLUGIN_GROUP, _add_plugins, build_parser


def test_a_plugin_that_fails_to_load_says_why_and_leaves_the_rest_working(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = argparse.ArgumentParser(prog="hecate")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up").set_defaults(run=lambda _args: 0)
    broken = EntryPoint(name="bench", value="hecate.no_such_module:add_parser", group=PLUGIN_GROUP)
    _add_plugins(sub, [broken])

    up = parser.parse_args(["up"])
    assert up.run(up) == 0
    bench = parser.parse_args(["bench"])
    assert bench.run(bench) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "'bench' command (hecate.no_such_module:add_parser) failed to load" in err
    assert "ModuleNotFoundError" in err


def test_the_installed_dev_tools_add_their_commands() -> None:
    parser = build_parser()
    for command in ("bench", "chaos"):
        with pytest.raises(SystemExit) as exit_:  # their --help parses: they loaded
            parser.parse_args([command, "--help"])
        assert exit_.value.code == 0
