"""Subcommands of the `gang-autoscaler` CLI.

Each module exposes `add_parser(subparsers)`, which registers its argument parser and sets
`func` to a callable taking the parsed namespace and returning the exit code.
"""
