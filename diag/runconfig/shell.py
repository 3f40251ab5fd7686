"""A training command's arguments out of a shell script or a text file holding the command line.

Megatron-LM jobs are launched by scripts like examples/gpt3/train_gpt3_175b_distributed.sh:
arguments gathered in variables (`GPT_ARGS="--num-layers 24 ..."`) or bash arrays
(`MODEL_ARGS=( --num-layers 32 ... )`), lines continued with `\\`, then
`torchrun $DISTRIBUTED_ARGS pretrain_gpt.py ${MODEL_ARGS[@]} ...`. Variables are expanded where
their value is written in the script; one set from outside (`$NNODES` from SLURM) stays
unexpanded, and a flag whose value still holds a `$` is reported as not literal, not guessed.
Every `--flag [value]` in the text is taken, the last one winning, as argparse does.
"""
from __future__ import annotations

import re
import shlex

_CONTINUATION = re.compile(r"\\\r?\n")
# A line that only assigns: NAME=value, NAME="...", NAME=( array, possibly over lines ). Not
# `NAME=1 torchrun ...`, which sets the variable for one command: that line is the command.
_ASSIGN = re.compile(r"^[ \t]*(?:export[ \t]+|declare[ \t]+(?:-\w+[ \t]+)*|local[ \t]+)?([A-Za-z_]\w*)="
                     r"(\([^)]*\)|\"[^\"]*\"|'[^']*'|[^\s;#]*)[ \t]*(?:[;#].*)?$", re.M)
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)(?:\[[@*]\])?(?::-([^}]*))?\}|\$([A-Za-z_]\w*)")
MAX_EXPANSIONS = 20           # variables defined through variables; a cycle stops here


def _variables(text: str) -> dict[str, str]:
    """NAME -> value as written (quotes and array parentheses removed), the last one winning."""
    out = {}
    for name, value in _ASSIGN.findall(text):
        value = value.strip()
        if value.startswith("(") and value.endswith(")"):
            value = value[1:-1]
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[name] = value
    return out


def _value(m: re.Match, variables: dict[str, str]) -> str:
    """A variable's value; `${X:-default}`'s default when X is not set in the script; else the
    reference itself, left for the caller to report as not literal."""
    name = m.group(1) or m.group(3)
    if name in variables:
        return variables[name]
    return m.group(2) if m.group(2) is not None else m.group(0)


def _expand(text: str, variables: dict[str, str]) -> str:
    for _ in range(MAX_EXPANSIONS):
        new = _VAR.sub(lambda m: _value(m, variables), text)
        if new == text:
            break
        text = new
    return text


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:           # an unbalanced quote: split on blanks rather than give up
        return re.sub(r"#.*", "", text).split()


def command_args(text: str, booleans: frozenset[str]) -> dict[str, object]:
    """argparse-style names -> values ('8', or True for a flag without one) of every `--flag`
    in the script or command line. `booleans`: flags that never take a value (store_true)."""
    text = _CONTINUATION.sub(" ", text)
    text = _expand(_ASSIGN.sub("", text), _variables(text))
    toks, args = _tokens(text), {}
    for i, tok in enumerate(toks):
        if not tok.startswith("--") or len(tok) < 3:
            continue
        name, eq, value = tok[2:].partition("=")
        name = name.replace("-", "_")
        if eq:
            args[name] = value
        elif name in booleans or i + 1 == len(toks) or toks[i + 1].startswith("--"):
            args[name] = True
        else:
            args[name] = toks[i + 1]
    return args
