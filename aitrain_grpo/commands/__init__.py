"""Entry points: the `aitrain` command line and the commands that are more than a flag parser.

Left out: library logic; each command calls into env/, engine/, training/ and runlog/.
"""
