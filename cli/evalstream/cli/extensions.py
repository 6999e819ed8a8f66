"""Command modules beyond the core ones in main.py. Each module defines

    def register(sub: argparse._SubParsersAction) -> None

which adds its sub-parser(s) with `set_defaults(handler=async_fn)`, where
`async_fn(args, settings) -> None`. Add one line here per module.
"""

MODULES: list[str] = [
    "evalstream.cli.datasets_cmd",
    "evalstream.cli.compare",
    "evalstream.cli.reproduce",
    "evalstream.cli.audit",
    "evalstream.cli.regrade",
    "evalstream.cli.export",
]
