"""The bash lexer of `--from` (autotune/verl/launch_script.py): a launch script's text as words (made of parts, with
their quote context) and operators, then as commands. Nothing is executed; expansion is launch_script's.

Why not `shlex`: it drops the quote context that expansion needs (`'$HOME'` is literal, `"$HOME"` is not), splits
`$(date +%Y)` into two words, and treats a `#` inside a word as a comment.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from autotune.errors import LaunchScriptError


class Word(NamedTuple):
    # parts: ("lit", text, quoted) | ("param", inner, quoted, source) | ("cmd", source, quoted)
    #        | ("arith", expr, quoted, source) | ("array", words)
    parts: tuple
    offset: int


class Op(NamedTuple):
    text: str
    offset: int


_OPERATORS = ("<<<", "&&", "||", ";;", ">>", ">&", "<&", "&>", "<<", "|", "&", ";", "<", ">", "(", ")", "\n")
_OPERATOR_STARTS = frozenset(op[0] for op in _OPERATORS)  # most characters start none: skip the search
_SEPARATORS = {"\n", ";", ";;", "&&", "||", "&"}
REDIRECTIONS = {"<<<", ">>", ">&", "<&", "&>", "<<", "<", ">"}
NAME = re.compile(r"[A-Za-z_]\w*")
ASSIGNMENT = re.compile(r"([A-Za-z_]\w*)(\+?)=")
_HEREDOC_DELIMITER = re.compile(r"-?[ \t]*(['\"]?)([^\s'\";|&<>()]+)\1")


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


class _WordBuilder:
    def __init__(self) -> None:
        self.parts: list = []
        self.offset = -1

    @property
    def empty(self) -> bool:
        return not self.parts

    def add(self, part: tuple, offset: int) -> None:
        if self.offset < 0:
            self.offset = offset
        last = self.parts[-1] if self.parts else None
        if part[0] == "lit" and last and last[0] == "lit" and last[2] == part[2]:
            # characters are gathered in a list and joined once: `last + char` per character is quadratic
            chunks = last[1] if isinstance(last[1], list) else [last[1]]
            chunks.append(part[1])
            self.parts[-1] = ("lit", chunks, part[2])
        else:
            self._join_last()
            self.parts.append(part)

    def _join_last(self) -> None:
        if self.parts and self.parts[-1][0] == "lit" and isinstance(self.parts[-1][1], list):
            self.parts[-1] = ("lit", "".join(self.parts[-1][1]), self.parts[-1][2])

    def assignment_prefix(self) -> bool:
        """`NAME=` or `NAME+=` so far: a following `(` opens an array literal."""
        self._join_last()
        return (len(self.parts) == 1 and self.parts[0][0] == "lit" and not self.parts[0][2]
                and ASSIGNMENT.fullmatch(self.parts[0][1]) is not None)

    def fd_number(self) -> bool:
        """Just digits so far: the file descriptor of a redirection like `2>&1`."""
        self._join_last()
        return len(self.parts) == 1 and self.parts[0][0] == "lit" and self.parts[0][1].isdigit()

    def flush(self, out: list) -> None:
        self._join_last()
        if self.parts:
            out.append(Word(tuple(self.parts), self.offset))
        self.parts, self.offset = [], -1


class Lexer:
    def __init__(self, text: str, source: str) -> None:
        self.text, self.source, self.i = text, source, 0
        self.heredocs: list[tuple[str, int]] = []  # (delimiter, offset) of bodies that start after this line

    def error(self, what: str, offset: int) -> LaunchScriptError:
        return LaunchScriptError(f"{self.source}: line {line_of(self.text, offset)}: {what}")

    def tokens(self, closing: str | None = None, single_word: bool = False) -> list:
        """Words and operators to the end of the text, or to `closing` (the `)` of an array literal).

        `single_word` lexes the word of `${X:-word}`: blanks and operators are plain characters there.
        """
        text, out, word = self.text, [], _WordBuilder()
        while self.i < len(text):
            c, start = text[self.i], self.i
            if c == "\\":
                escaped = text[self.i + 1:self.i + 2]
                if escaped != "\n":  # backslash-newline is a line continuation
                    word.add(("lit", escaped or "\\", True), start)
                self.i += 2
            elif c == "'":
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise self.error("unterminated single quote", start)
                word.add(("lit", text[self.i + 1:end], True), start)
                self.i = end + 1
            elif c == '"':
                self._double_quoted(word)
            elif c in "$`":
                word.add(self._substitution(quoted=False), start)
            elif single_word:
                word.add(("lit", c, False), start)
                self.i += 1
            elif c in " \t":
                word.flush(out)
                self.i += 1
            elif c == "#" and word.empty:
                newline = text.find("\n", self.i)
                self.i = len(text) if newline < 0 else newline
            elif closing and c == closing:
                word.flush(out)
                self.i += 1
                return out
            elif (c == "~" and (word.empty or word.assignment_prefix())  # bash expands ~ in `X=~/a`, not in `a.b=~/a`
                  and text[self.i + 1:self.i + 2] in ("/", "", " ", "\t", "\n")):
                word.add(("param", "HOME", False, "~"), start)
                self.i += 1
            elif c == "(" and word.assignment_prefix():
                self.i += 1
                elements = tuple(t for t in self.tokens(closing=")") if isinstance(t, Word))
                word.add(("array", elements), start)
            elif c in _OPERATOR_STARTS and (op := next(op for op in _OPERATORS if text.startswith(op, self.i))):
                if op in REDIRECTIONS and word.fd_number():
                    word = _WordBuilder()
                word.flush(out)
                out.append(Op(op, start))
                self.i += len(op)
                if op == "<<":
                    out.append(self._heredoc_delimiter())
                elif op == "\n":
                    self._skip_heredoc_bodies()
            else:
                word.add(("lit", c, False), start)
                self.i += 1
        if closing:
            raise self.error(f"unterminated array: no closing `{closing}`", len(text))
        word.flush(out)
        return out

    def _double_quoted(self, word: _WordBuilder) -> None:
        text, start, empty = self.text, self.i, True
        self.i += 1
        while self.i < len(text):
            c = text[self.i]
            empty = empty and c == '"'
            if c == '"':
                self.i += 1
                if empty:  # "" is still a word, while "${EMPTY[@]}" is none
                    word.add(("lit", "", True), start)
                return
            if c == "\\" and text[self.i + 1:self.i + 2] in ('"', "\\", "$", "`", "\n"):
                if text[self.i + 1] != "\n":
                    word.add(("lit", text[self.i + 1], True), self.i)
                self.i += 2
            elif c in "$`":
                word.add(self._substitution(quoted=True), self.i)
            else:
                word.add(("lit", c, True), self.i)
                self.i += 1
        raise self.error("unterminated double quote", start)

    def _substitution(self, *, quoted: bool) -> tuple:
        text, i = self.text, self.i
        if text[i] == "`":
            end = i + 1
            while end < len(text) and text[end] != "`":
                end += 2 if text[end] == "\\" else 1
            if end >= len(text):
                raise self.error("unterminated backquote", i)
            self.i = end + 1
            return ("cmd", text[i:end + 1], quoted)
        follower = text[i + 1:i + 2]
        if follower == "(":
            end = self._matching(i + 1, "(", ")")
            self.i = end + 1
            if text.startswith("((", i + 1) and self._matching(i + 2, "(", ")") == end - 1:
                return ("arith", text[i + 3:end - 1], quoted, text[i:end + 1])
            return ("cmd", text[i:end + 1], quoted)
        if follower == "{":
            end = self._matching(i + 1, "{", "}")
            self.i = end + 1
            return ("param", text[i + 2:end], quoted, text[i:end + 1])
        if name := NAME.match(text, i + 1):
            self.i = name.end()
            return ("param", name.group(), quoted, text[i:self.i])
        if follower and follower in "@*#?$!-0123456789":
            self.i = i + 2
            return ("param", follower, quoted, text[i:self.i])
        self.i = i + 1
        return ("lit", "$", quoted)

    def _matching(self, i: int, opening: str, closing: str) -> int:
        """Offset of the bracket closing the one at `i`, skipping quoted text."""
        text, depth, j = self.text, 0, i
        while j < len(text):
            c = text[j]
            if c == "\\":
                j += 2
                continue
            if c in "'\"":
                end = text.find(c, j + 1)
                while c == '"' and end > 0 and text[end - 1] == "\\":
                    end = text.find(c, end + 1)
                if end < 0:
                    raise self.error("unterminated " + ("single" if c == "'" else "double") + " quote", j)
                j = end + 1
                continue
            depth += (c == opening) - (c == closing)
            if depth == 0:
                return j
            j += 1
        raise self.error(f"unterminated `{text[i - 1:i + 1]}`", i - 1)

    def _heredoc_delimiter(self) -> Word:
        match = _HEREDOC_DELIMITER.match(self.text, self.i)
        if not match:
            raise self.error("here-document without a delimiter", self.i)
        self.heredocs.append((match.group(2), match.start()))
        self.i = match.end()
        return Word((("lit", match.group(2), True),), match.start())

    def _skip_heredoc_bodies(self) -> None:
        for delimiter, start in self.heredocs:
            while self.i < len(self.text):
                newline = self.text.find("\n", self.i)
                end = len(self.text) if newline < 0 else newline
                line, self.i = self.text[self.i:end], end + 1
                if line.strip() == delimiter:
                    break
            else:
                raise self.error(f"here-document not terminated by {delimiter}", start)
        self.heredocs = []


class Command(NamedTuple):
    tokens: tuple      # words and operators other than separators
    offset: int
    chained: bool      # after && or ||: it may or may not run


def commands(tokens: list) -> list[Command]:
    out, current, chained = [], [], False
    for token in tokens:
        if isinstance(token, Op) and token.text in _SEPARATORS:
            if current:
                out.append(Command(tuple(current), current[0].offset, chained))
            if current or token.text != "\n":
                chained = token.text in ("&&", "||")
            current = []
        else:
            current.append(token)
    if current:
        out.append(Command(tuple(current), current[0].offset, chained))
    return out
