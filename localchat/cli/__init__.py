"""The command line: the Typer app and one module per command group.

Commands collect options and call the package; errors and outcomes become exit codes here only.
"""
