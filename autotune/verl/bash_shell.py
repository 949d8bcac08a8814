"""A launch script's bash, walked in order without running it (verl/launch_script.py reads a job through it): variables
and arrays assigned, exported and expanded the way bash would, `case` and arithmetic where their inputs are known,
and each `python -m ...main_ppo` call recorded with its Hydra arguments (ImportedJob). Whatever cannot be known
without running the script keeps its source text and its name lands in `ImportedJob.unresolved`."""

from __future__ import annotations

import ast
import fnmatch
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import NamedTuple, Union

from autotune.errors import LaunchScriptError
from autotune.verl.bash_lexer import ASSIGNMENT, NAME, REDIRECTIONS, Command, Lexer, Op, Word

MAX_EXPANSION_CHARS = 1 << 20  # what the words of one command expand to (`B=$A$A` ten times over doubles 1024x)
MAX_EXPANSION_WORDS = 10_000  # the words of `"${A[@]}"` (a verl command has a few hundred at most)
MAX_EXPANSION_DEPTH = 32  # `${A:-${B:-...}}` nested in each other, or variables naming variables in `$(( ))`


@dataclass(frozen=True)
class ImportedJob:
    source: str                  # the file it came from
    overrides: dict[str, str]    # dotted Hydra key ("+key"/"~key" kept) -> value as Hydra receives it; later wins
    config_path: str | None      # --config-path / --config-name, if given
    config_name: str | None
    env: dict[str, str]          # variables assigned or exported before the command, with known values
    unresolved: tuple[str, ...]  # what could not be read statically, by name, in order of appearance
    # Override keys whose value depends on something in `unresolved`; their value keeps the source text
    # of the unknown part (e.g. "$HOME/data/train.parquet").
    unresolved_keys: tuple[str, ...] = ()
    entry_module: str = "verl.trainer.main_ppo"  # what `python -m` runs
    keys_after_args: tuple[str, ...] = ()  # keys the script sets after passing on its own arguments ("$@")
    # the part of `env` the job's process receives: exported (`export`, `declare -x`, `X=1 python3 ...`) or already
    # in the environment the script starts in
    exported_env: dict[str, str] = field(default_factory=dict)

    def resolved_overrides(self) -> dict[str, str]:
        return {key: value for key, value in self.overrides.items() if key not in self.unresolved_keys}

    def with_arguments(self, arguments: list[str]) -> "ImportedJob":
        """The job as bash and Hydra run it with `arguments` (key=value, given after `--`) as the script's own
        arguments: where the script passes them on ("$@"), its keys after that point win over them (Hydra applies
        overrides in order, later wins); elsewhere they come last. A key whose value the shell computes takes the
        value given: that is the remedy the import's error names."""
        given = dict(a.split("=", 1) for a in arguments)
        overrides = dict(self.overrides)
        for key, value in given.items():
            if key in self.keys_after_args and key not in self.unresolved_keys:
                continue  # the script's own later value wins, as it does when bash runs it
            overrides[key] = value
        unresolved = tuple(u for u in self.unresolved if not (given and u in ("$@", "$*")))
        return replace(self, overrides=overrides, unresolved=unresolved,
                       unresolved_keys=tuple(k for k in self.unresolved_keys if k not in given))


# ---------------------------------------------------------------------------------------------------
# Expansion. A value is a tuple of pieces (text, names); names is empty for known text and otherwise
# names what could not be read (the text is then the source as written, e.g. "$(date +%Y%m%d)").

_Piece = tuple[str, tuple[str, ...]]
_Text = tuple[_Piece, ...]
_Value = Union[_Text, list]  # a scalar, or an array: list of _Text


def _unknown(source: str, *names: str) -> _Text:
    return ((source, names),)


def _text(value: _Text) -> str:
    return "".join(text for text, _ in value)


def _names(value: _Text) -> tuple[str, ...]:
    return tuple(dict.fromkeys(name for _, names in value for name in names))


def _joined(elements: list[_Text]) -> _Text:
    """Array elements as one word, separated by blanks (`"${A[*]}"`, or `"${A[@]}"` in an assignment)."""
    return tuple(piece for k, element in enumerate(elements) for piece in ((" ", ()),) * (k > 0) + element)


def _int64(value: int) -> int:
    """`value` as bash's 64-bit arithmetic holds it: it wraps (9223372036854775807 + 1 is -9223372036854775808)."""
    return (value + (1 << 63)) % (1 << 64) - (1 << 63)


def _known_prefix(value: _Text) -> str:
    prefix = []
    for text, names in value:
        if names:
            break
        prefix.append(text)
    return "".join(prefix)


_SPECIAL_PARAMETERS = set("@*#?$!-")


class _Case:
    """A `case` block whose subject is known: only the branch whose pattern matches runs (as bash does)."""

    def __init__(self, subject: str) -> None:
        self.subject, self.active, self.matched = subject, False, False

    def enter_branch(self, patterns: list[str]) -> None:
        hit = not self.matched and any(fnmatch.fnmatchcase(self.subject, p) for p in patterns)
        self.active, self.matched = hit, self.matched or hit
_BLOCK_NAMES = {"if": "if block", "for": "for loop", "while": "while loop", "until": "until loop",
                "select": "select loop"}
_DECLARE = {"export", "declare", "typeset", "local", "readonly"}


def _literal(token) -> str | None:
    """The text of an unquoted plain word (a keyword candidate), else None."""
    if isinstance(token, Word) and len(token.parts) == 1 and token.parts[0][0] == "lit" and not token.parts[0][2]:
        return token.parts[0][1]
    return None


def _split_assignment(word: Word):
    """(name, append, value parts) for `NAME=value` / `NAME+=value`, else None."""
    first = word.parts[0]
    if first[0] != "lit" or first[2] or not (match := ASSIGNMENT.match(first[1])):
        return None
    rest = first[1][match.end():]
    parts = ((("lit", rest, False),) if rest else ()) + word.parts[1:]
    return match.group(1), bool(match.group(2)), parts


def _is_entry_module(module: str) -> bool:
    return module.endswith(".main_ppo") or re.fullmatch(r"recipe\.[\w.]+\.main_\w+", module) is not None


def _is_python(value: _Text) -> bool:
    # An unknown launcher (`"${LAUNCH[@]}" -m verl.trainer.main_ppo`) counts; the module name decides.
    return bool(_names(value)) or re.fullmatch(r"python[\d.]*", _text(value).rsplit("/", 1)[-1]) is not None


class _Invocation(NamedTuple):
    offset: int
    job: ImportedJob


class Shell:
    """Walks the commands in order, tracking variables, and records each main_ppo invocation."""

    def __init__(self, source: str, environ: Mapping[str, str] | None) -> None:
        self.source = source
        self.environ = dict(environ or {})
        self.vars: dict[str, _Value | None] = {}   # None: unset by the script
        self.exported: set[str] = set()
        self.blocks: list[str] = []
        self.function_brace_pending = False
        self.sourced: list[str] = []
        self.invocations: list[_Invocation] = []
        self.entry_points_seen: list[str] = []
        self.depth = 0  # nesting of expansions now under way (deeper())

    # ---- variables
    def lookup(self, name: str) -> _Value | None:
        if name in self.vars:
            return self.vars[name]
        if name in self.environ:
            return ((self.environ[name], ()),)
        return None

    def scalar(self, name: str) -> _Text | None:
        value = self.lookup(name)
        if isinstance(value, list):
            return value[0] if value else ()
        return value

    def assign(self, name: str, append: bool, value: _Value, *, certain: bool) -> None:
        old = self.lookup(name)
        if not certain:  # set inside a conditional or a loop: it may or may not have happened
            unknown_element = _unknown(f"${{{name}[@]}}", name)
            if append and isinstance(old, list):
                value = old + [unknown_element]  # the elements already there stay known
            else:
                value = [unknown_element] if isinstance(value, list) else _unknown(f"${{{name}}}", name)
        elif append and isinstance(old, list):
            value = old + (value if isinstance(value, list) else [value])
        elif append and old is not None:
            value = old + (_joined(value) if isinstance(value, list) else value)
        self.vars[name] = value

    # ---- expansion
    def expand(self, word: Word, *, split: bool = True) -> list[_Text]:
        """The fields a word expands to: unquoted expansions are split on blanks, "${A[@]}" gives one per element."""
        fields: list[_Text] = []
        current: list[_Piece] | None = None
        size_chars = 0  # of everything this word expands to: bounded by MAX_EXPANSION_CHARS

        def end_field() -> None:
            nonlocal current
            if current is not None:
                fields.append(tuple(current))
                if len(fields) > MAX_EXPANSION_WORDS:
                    raise LaunchScriptError(f"{self.source}: a word expands to more than {MAX_EXPANSION_WORDS} words "
                                            "(the expansion size limit)")
            current = None

        def add(pieces) -> None:
            nonlocal current, size_chars
            for text, _ in pieces:
                size_chars += len(text) + 1  # + 1: a field of empty pieces still costs
            if size_chars > MAX_EXPANSION_CHARS:
                raise LaunchScriptError(f"{self.source}: a word expands to more than {MAX_EXPANSION_CHARS} characters "
                                        "(the expansion size limit)")
            current = current if current is not None else []
            current.extend(pieces)

        for part in word.parts:
            value = self.part_value(part)
            if isinstance(value, list) and not split:
                value = _joined(value)
            quoted = part[0] in ("lit", "array") or part[2]
            for k, element in enumerate(value if isinstance(value, list) else [value]):
                if k:
                    end_field()
                if quoted or not split:
                    add(element)
                    continue
                for text, names in element:
                    if names:
                        add([(text, names)])
                        continue
                    for n, chunk in enumerate(re.split(r"[ \t\n]+", text)):
                        if n:
                            end_field()
                        if chunk:
                            add([(chunk, ())])
        end_field()
        return fields

    def expand_one(self, parts: tuple) -> _Text:
        fields = self.expand(Word(parts, 0), split=False)
        return fields[0] if fields else ()

    def part_value(self, part: tuple) -> _Value:
        kind = part[0]
        if kind == "lit":
            return ((part[1], ()),)
        if kind == "cmd":
            return _unknown(part[1], part[1])
        if kind == "arith":
            return self.arithmetic(part[1], part[3])
        if kind == "param":
            return self.parameter(part[1], part[3])
        return _unknown("(...)", "array literal outside an assignment")

    def parameter(self, inner: str, source: str) -> _Value:
        if inner in _SPECIAL_PARAMETERS or inner.isdigit():
            return _unknown(source, "$" + inner)
        if match := re.fullmatch(r"([A-Za-z_]\w*)\[([@*])\]", inner):
            value = self.lookup(match.group(1))
            if value is None:
                value = [_unknown(source, match.group(1))]
            elements = value if isinstance(value, list) else [value]
            return elements if match.group(2) == "@" else _joined(elements)  # "${A[*]}" is one word
        if match := re.fullmatch(r"([A-Za-z_]\w*)\[(\d+)\]", inner):  # one element: ${FILES[0]}
            value = self.lookup(match.group(1))
            elements = value if isinstance(value, list) else [value] if value is not None else None
            if elements is None or any(_names(e) for e in elements):
                return _unknown(source, match.group(1))
            index = int(match.group(2))
            return elements[index] if index < len(elements) else ()
        match = re.fullmatch(r"([A-Za-z_]\w*)(?:(:?[-=+?])(.*))?", inner, re.S)
        if not match:
            return _unknown(source, source)  # ${#X}, ${X%suffix}, ${X/a/b}, ...: not modelled
        name, op, word = match.groups()
        value = self.scalar(name)
        if op is None:
            return value if value is not None else _unknown(source, name)
        if value is not None and _names(value):
            return value  # whether the default applies depends on what we cannot read
        is_set = value is not None and not (op.startswith(":") and _text(value) == "")
        if op.endswith("+"):
            return self.nested_word(word) if is_set else ()
        if is_set:
            return value
        if op.endswith("?"):
            return _unknown(source, name)
        default = self.nested_word(word)
        if op.endswith("="):
            self.vars[name] = default
        return default

    def nested_word(self, word: str) -> _Text:
        with self.deeper():
            lexer = Lexer(word, self.source)
            tokens = lexer.tokens(single_word=True)
            return self.expand_one(tokens[0].parts) if tokens else ()

    @contextmanager
    def deeper(self) -> Iterator[None]:
        """One more level of nested expansion; past MAX_EXPANSION_DEPTH the import stops (bash has a limit too:
        "expression recursion level exceeded")."""
        if self.depth >= MAX_EXPANSION_DEPTH:
            raise LaunchScriptError(f"{self.source}: expansions nested more than {MAX_EXPANSION_DEPTH} levels deep "
                                    "(the expansion depth limit)")
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def arithmetic(self, expr: str, source: str) -> _Text:
        """Integer + - * / % over literals and variables, as `$(( ))` computes them; anything else is unread."""
        missing: list[str] = []

        def number(node) -> int:
            if isinstance(node, ast.Constant) and type(node.value) is int:
                return _int64(node.value)
            if isinstance(node, ast.Name):
                value = self.scalar(node.id)
                if value is None or _names(value):
                    missing.extend(_names(value) if value else (node.id,))
                    return 1
                with self.deeper():  # a variable holding an expression: `A=B+1`, `B=A` would never end
                    return number(ast.parse(_text(value).strip() or "0", mode="eval").body)
            if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
                return _int64(-number(node.operand)) if isinstance(node.op, ast.USub) else number(node.operand)
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Mod)):
                a, b = number(node.left), number(node.right)
                if isinstance(node.op, (ast.Div, ast.Mod)):
                    quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)  # bash truncates toward 0
                    return _int64(quotient if isinstance(node.op, ast.Div) else a - b * quotient)
                return _int64({ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(node.op)])
            raise ValueError(ast.dump(node))

        try:
            result = number(ast.parse(re.sub(r"\$\{?([A-Za-z_]\w*)\}?", r"\1", expr).strip(), mode="eval").body)
            text = str(result)  # ValueError past Python's 4300-digit limit for int -> str
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return _unknown(source, source)
        return _unknown(source, *missing) if missing else ((text, ()),)

    # ---- commands
    def run(self, command: Command) -> None:
        tokens = list(command.tokens)
        keyword = _literal(tokens[0])
        if keyword in ("fi", "done", "esac", "}"):
            if self.blocks:
                self.blocks.pop()
            return
        skipping = any(isinstance(b, _Case) and not b.active for b in self.blocks)
        if keyword == "case":
            self.blocks.append(self.case_block(tokens[1] if len(tokens) > 1 else None))
            return
        if keyword in ("if", "elif", "while", "until", "select"):
            if keyword != "elif":
                self.blocks.append(_BLOCK_NAMES[keyword])
            if len(tokens) > 1 and not skipping:  # the condition runs, inside the block (`while read X`)
                self.run(command._replace(tokens=tuple(tokens[1:])))
            return
        if keyword == "for":
            self.blocks.append(_BLOCK_NAMES["for"])
            if len(tokens) > 1 and (name := _literal(tokens[1])) and NAME.fullmatch(name):
                self.vars[name] = _unknown(f"${{{name}}}", name)
            return
        if keyword in ("then", "do", "else", "{"):
            if keyword == "{":
                if self.function_brace_pending:
                    self.function_brace_pending = False
                else:
                    self.blocks.append("{")
            if len(tokens) > 1:
                self.run(command._replace(tokens=tuple(tokens[1:])))
            return
        if self.blocks and (isinstance(self.blocks[-1], _Case) or str(self.blocks[-1]).startswith("case ")):
            closing = next((k for k, t in enumerate(tokens) if isinstance(t, Op) and t.text == ")"), None)
            if closing is not None:  # a `pattern)` line
                if isinstance(self.blocks[-1], _Case):
                    self.blocks[-1].enter_branch([_text(self.expand_one(t.parts)) for t in tokens[:closing]
                                                  if isinstance(t, Word)])
                tokens = tokens[closing + 1:]
                if tokens:
                    self.run(command._replace(tokens=tuple(tokens)))
                return
        if skipping:
            return
        if self.function_definition(tokens):
            return
        segment: list = []
        for token in tokens + [Op("|", -1)]:
            if isinstance(token, Op) and token.text == "|":
                self.simple_command(segment, command)
                segment = []
            else:
                segment.append(token)

    def case_block(self, subject) -> "_Case | str":
        """A known subject selects its branch; an unknown one makes every branch uncertain, and names what to set."""
        value = self.expand_one(subject.parts) if isinstance(subject, Word) else _unknown("?", "?")
        if not _names(value):
            return _Case(_text(value))
        names = [n for n in _names(value) if NAME.fullmatch(n)] or [
            part[1] for part in (subject.parts if isinstance(subject, Word) else ()) if part[0] == "param"]
        hint = f"; set {' or '.join(names)} in the environment to read it" if names else ""
        return f"case block on {_text(value)} (its subject is not known statically{hint})"

    def uncertain_blocks(self) -> list[str]:
        return [b for b in self.blocks if b != "{" and not isinstance(b, _Case)]

    def function_definition(self, tokens: list) -> bool:
        texts = [t.text if isinstance(t, Op) else _literal(t) for t in tokens[:4]]
        if texts[:1] == ["function"] and len(texts) > 1:
            name, rest = texts[1], texts[2:]
        elif texts[1:3] == ["(", ")"]:
            name, rest = texts[0], texts[3:]
        else:
            return False
        self.blocks.append(f"function {name}")
        self.function_brace_pending = "{" not in rest
        return True

    def simple_command(self, tokens: list, command: Command) -> None:
        words = []
        skip_next = False
        for token in tokens:  # drop redirections and their targets, and stray parentheses
            if skip_next:
                skip_next = False
            elif isinstance(token, Op):
                skip_next = token.text in REDIRECTIONS
            else:
                words.append(token)
        certain = not self.uncertain_blocks() and not command.chained
        prefix = []
        while words and (assignment := _split_assignment(words[0])):
            prefix.append(assignment)
            words = words[1:]
        if not words:
            for name, append, parts in prefix:
                self.assign(name, append, self.assignment_value(parts), certain=certain)
            return
        first = _literal(words[0])
        if first in _DECLARE:
            self.declare(first, words[1:], certain)
            return
        if first == "unset":
            for word in words[1:]:
                if (name := _literal(word)) and NAME.fullmatch(name):
                    self.vars[name] = None if certain else _unknown(f"${{{name}}}", name)
            return
        if first == "read":
            for word in words[1:]:
                if (name := _literal(word)) and NAME.fullmatch(name):
                    self.vars[name] = _unknown(f"${{{name}}}", name)
            return
        fields = [field for word in words for field in self.expand(word)]
        if fields and _text(fields[0]) in ("source", ".") and len(fields) > 1:
            self.sourced.append(f"source {_text(fields[1])}")
            return
        self.maybe_invocation(fields, prefix, command)

    def assignment_value(self, parts: tuple) -> _Value:
        if len(parts) == 1 and parts[0][0] == "array":
            return [field for word in parts[0][1] for field in self.expand(word)]
        return self.expand_one(parts)

    def declare(self, builtin: str, words: list, certain: bool) -> None:
        exporting = builtin == "export"
        for word in words:
            flag = _literal(word)
            if flag and flag.startswith("-"):
                exporting = exporting or "x" in flag
            elif assignment := _split_assignment(word):
                name, append, parts = assignment
                self.assign(name, append, self.assignment_value(parts), certain=certain)
                if exporting:
                    self.exported.add(name)
            elif flag and NAME.fullmatch(flag) and exporting:
                self.exported.add(flag)

    def maybe_invocation(self, fields: list[_Text], prefix: list, command: Command) -> None:
        texts = [_text(field) for field in fields]
        for k in range(1, len(fields) - 1):
            if texts[k] != "-m":
                continue
            launcher = k - 1
            while launcher > 0 and texts[launcher].startswith("-"):  # python options such as -u
                launcher -= 1
            entry = _is_entry_module(texts[k + 1]) and _is_python(fields[launcher])
            if entry:
                self.record(texts[k + 1], fields[k + 2:], prefix, command)
                return
            self.entry_points_seen.append(" ".join(" ".join(texts[:k + 2]).split()))
        if len(fields) > 1 and _is_python(fields[0]) and texts[1].endswith(".py"):
            self.entry_points_seen.append(f"{texts[0]} {texts[1]}")

    def record(self, module: str, args: list[_Text], prefix: list, command: Command) -> None:
        hydra = _hydra_arguments(args)
        unresolved = dict.fromkeys(hydra.unresolved)
        unresolved.update(dict.fromkeys(self.uncertain_blocks()))
        env: dict[str, str] = {}
        exported_env: dict[str, str] = {}
        # bash passes a variable on when it is exported, or already was in the environment the script started in
        script_vars = [(name, value, name in self.exported or name in self.environ)
                       for name, value in self.vars.items() if value is not None and not isinstance(value, list)]
        command_vars = [(name, self.expand_one(parts), True) for name, _append, parts in prefix]  # `X=1 python3 ...`
        for name, value, reaches_job in script_vars + command_vars:
            if not _names(value):
                env[name] = _text(value)
                if reaches_job:
                    exported_env[name] = _text(value)
            elif reaches_job:  # an unknown value in the job's environment
                unresolved.update(dict.fromkeys(_names(value)))
        unresolved.update(dict.fromkeys(self.sourced))
        job = ImportedJob(source=self.source, overrides=hydra.overrides, config_path=hydra.config_path,
                          config_name=hydra.config_name, env=env, unresolved=tuple(unresolved),
                          unresolved_keys=hydra.unresolved_keys, entry_module=module,
                          keys_after_args=hydra.keys_after_args, exported_env=exported_env)
        self.invocations.append(_Invocation(command.offset, job))


class _HydraArguments(NamedTuple):
    overrides: dict[str, str]
    unresolved_keys: tuple[str, ...]
    config_path: str | None
    config_name: str | None
    unresolved: tuple[str, ...]
    keys_after_args: tuple[str, ...]


_CONFIG_FLAGS = {"--config-path": "path", "-cp": "path", "--config-name": "name", "-cn": "name"}


def _hydra_arguments(args: list[_Text]) -> _HydraArguments:
    """main_ppo's arguments: key=value overrides (later wins) and the config path and name."""
    overrides: dict[str, str] = {}
    unresolved_keys: dict[str, None] = {}
    config: dict[str, str | None] = {"path": None, "name": None}
    unresolved: dict[str, None] = {}
    after_args: dict[str, None] | None = None  # keys set after "$@", once it is seen
    fields = iter(args)
    for field in fields:
        text = _text(field)
        unresolved.update(dict.fromkeys(_names(field)))
        if after_args is None and {"$@", "$*"} & set(_names(field)):
            after_args = {}
        flag, eq, value = text.partition("=")
        if flag in _CONFIG_FLAGS:
            if not eq and (field := next(fields, None)) is not None:
                value = _text(field)
                unresolved.update(dict.fromkeys(_names(field)))
            config[_CONFIG_FLAGS[flag]] = value
        elif text.startswith("~") or "=" in _known_prefix(field):
            overrides[flag] = value  # "~key" alone deletes key: value ""
            if after_args is not None:
                after_args[flag] = None
            unresolved_keys.pop(flag, None)
            if _names(field):
                unresolved_keys[flag] = None
        elif not _names(field):
            unresolved[text] = None  # a Hydra flag autotune does not model, or a word that is no override
    return _HydraArguments(overrides, tuple(unresolved_keys), config["path"], config["name"], tuple(unresolved),
                           tuple(after_args or ()))
