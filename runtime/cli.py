"""`distlab`: simulate clusters, run the same plans for real, compare. Each subcommand is a module with
NAME, HELP, add_arguments(parser) and run(args); heavy imports (torch, matplotlib) stay inside run()."""
from __future__ import annotations

import importlib
import sys

from distlab.sim.cli import Parser, run_command

COMMANDS = [
    "distlab.sim.commands.simulate",
    "distlab.sim.commands.collective",
    "distlab.sim.commands.check",
    "distlab.sim.commands.memory",
    "distlab.sim.commands.plan",
    "distlab.sim.commands.lessons",
    "distlab.sim.commands.reproduce",
    "distlab.sim.commands.cluster",
    "distlab.runtime.commands.run",
    "distlab.runtime.commands.bench",
    "distlab.runtime.commands.calibrate",
    "distlab.runtime.commands.validate",
    "distlab.runtime.commands.diagnose",
    "distlab.runtime.commands.compare",
]


CODE_COMMANDS = ("simulate", "memory", "plan", "reproduce", "cluster", "validate")   # read files that name models


def version() -> str:
    """The installed package's version (pyproject.toml), through importlib.metadata."""
    from importlib.metadata import PackageNotFoundError, version as package_version
    try:
        return package_version("distlab")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> tuple[Parser, dict]:
    parser = Parser(prog="distlab", description=__doc__.split(".")[0] + ".",
                    epilog="Run 'distlab COMMAND --help' for each command's options.")
    parser.add_argument("--version", action="version", version=f"distlab {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    modules, parser.command_parsers = {}, {}
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:       # a command not written yet
                continue
            raise
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        if module.NAME in CODE_COMMANDS:
            p.add_argument("--allow-code", action="store_true", help="let a factory: (pkg.module:fn) named in a "
                           "data file be imported and run (off: only --model's own factory runs)")
        modules[module.NAME], parser.command_parsers[module.NAME] = module, p
    return parser, modules


def _factory_model(spec: dict, where: str):
    """``--model pkg.module:factory``: traced with torch (runtime/modules/factory.py), imported only when asked for."""
    from distlab.runtime.modules.factory import load
    return load(spec, where)


def main(argv: list[str] | None = None) -> int:
    from distlab.runtime.ranks.torchrun_rank import quiet_other_ranks
    from distlab.sim.models.spec import set_code_policy, set_factory_loader
    quiet_other_ranks()                # under torchrun, only global rank 0 prints (runtime/ranks/torchrun_rank.py)
    set_factory_loader(_factory_model)
    parser, modules = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:                        # named by the command's own parser: 'distlab simulate: error: ...'
        parser.command_parsers.get(args.command, parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command is None:           # like git: the help, then exit 2 (a command is required)
        parser.print_help(sys.stderr)
        return 2
    set_code_policy(True, getattr(args, "allow_code", False))     # data files run no code (sim/models/spec.py)
    try:
        return run_command(modules[args.command], args)
    finally:
        set_code_policy(False)


if __name__ == "__main__":
    sys.exit(main())
