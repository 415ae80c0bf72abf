"""Just enough of bash's lexer to tell, for every line, whether it starts a new command.

The patcher must never put its block inside a here-document, a multi-line string or a command
substitution. Nor may it take a line inside one for its anchor. This scanner follows here-documents,
quotes, backslashes, comments, substitutions and backticks. Where bash's rules get subtle, it raises
``PatchError(UNSURE_SHELL)`` instead of guessing. See docs/cli.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patcher.errors import BASH_SYNTAX, UNSURE_SHELL, PatchError

# Frames of the lexer's stack. CODE is the top level; SUBST is $( ), <( ), >( ).
CODE, SUBST, DQ, SQ, ANSI, BACKTICK, PARAM, ARITH = "code", "$(", '"', "'", "$'", "`", "${", "(("
_CODE_LIKE = (CODE, SUBST)
_WORD_BREAK = frozenset(" \t\n;&|()<>")  # metacharacters: they end a word and may start the next


@dataclass(frozen=True)
class Line:
    """How bash sees one line of a script.

    ``command``: the line starts a new command at the top level (not inside a here-document,
    a quote or a substitution, and not continued from the line before by ``\\``, ``|``, ``&&``
    or ``||``). ``code``: the line's text that bash reads as code or double-quoted text
    (comments, single-quoted text and here-document bodies left out).
    """

    command: bool
    code: str


def split_lines(text: str) -> list[str]:
    """``text`` cut into lines at ``\\n`` only, as bash does (each line keeps its ``\\n``)."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


@dataclass
class _Frame:
    kind: str
    depth: int = 0  # open parentheses or braces inside it, not yet closed


@dataclass
class _Heredoc:
    word: str
    strip_tabs: bool
    quoted: bool
    line: int


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = split_lines(text)
        self.stack = [_Frame(CODE)]
        self.pending: list[_Heredoc] = []
        self.command = [False] * len(self.lines)
        self.code: list[list[str]] = [[] for _ in self.lines]
        self.line = 0
        self.prev = "\n"  # the last character read as code (for comments and operators)
        self.last = ""  # the last two significant code characters on this line

    def unsure(self, why: str) -> PatchError:
        return PatchError(UNSURE_SHELL, f"line {self.line + 1}: {why}; refusing rather than guessing")

    def run(self) -> list[Line]:
        text, i = self.text, 0
        self.command[0] = bool(self.lines)
        while i < len(text):
            i = self.step(i)
        if self.pending:
            raise self.unsure(f"here-document <<{self.pending[0].word} has no body before the end of the file")
        if len(self.stack) > 1:
            raise PatchError(BASH_SYNTAX, f"the file ends inside an unclosed {self.stack[-1].kind} (bash -n fails too)")
        return [Line(c, "".join(k)) for c, k in zip(self.command, self.code, strict=True)]

    def emit(self, chars: str) -> None:
        if self.stack[-1].kind not in (SQ, ANSI):
            self.code[self.line].append(chars)

    def newline(self, i: int, escaped: bool) -> int:
        """Move to the next line (``i`` is past the newline); read pending here-document bodies."""
        kind = self.stack[-1].kind
        if self.pending and (escaped or kind not in _CODE_LIKE):
            raise self.unsure("a here-document starts inside a quote, a continued line or backticks")
        continued = escaped or self.last.endswith("|") or self.last in ("&&", "|&")
        self.line += 1
        for heredoc in self.pending:
            i = self.heredoc_body(i, heredoc)
        self.pending = []
        if self.line < len(self.lines):
            self.command[self.line] = kind == CODE and len(self.stack) == 1 and not continued
        self.prev, self.last = "\n", ""
        return i

    def heredoc_body(self, i: int, heredoc: _Heredoc) -> int:
        while self.line < len(self.lines):
            body = self.lines[self.line]
            self.line += 1
            i += len(body)
            content = body[:-1] if body.endswith("\n") else body
            if (content.lstrip("\t") if heredoc.strip_tabs else content) == heredoc.word:
                return i
            if not heredoc.quoted and content.endswith("\\"):
                raise self.unsure(f"a line of here-document <<{heredoc.word} ends with a backslash")
        raise PatchError(
            UNSURE_SHELL,
            f"line {heredoc.line + 1}: here-document <<{heredoc.word} never ends; refusing rather than guessing",
        )

    def heredoc_word(self, i: int) -> int:
        """Read the word after ``<<`` or ``<<-`` at ``i``; queue its body; return past it."""
        text, opened = self.text, self.line
        strip = text.startswith("-", i)
        i += 1 if strip else 0
        while i < len(text) and text[i] in " \t":
            i += 1
        word, quoted = [], False
        while i < len(text) and text[i] not in _WORD_BREAK:
            char = text[i]
            if char in "'\"":
                end = text.find(char, i + 1)
                if end < 0 or "\n" in text[i:end]:
                    raise self.unsure("a quoted here-document word spans lines")
                word.append(text[i + 1 : end])
                quoted, i = True, end + 1
            elif char == "\\":
                if text.startswith("\n", i + 1):
                    raise self.unsure("a here-document word continued on the next line")
                word.append(text[i + 1 : i + 2])
                quoted, i = True, i + 2
            elif char in "$`":
                raise self.unsure("a here-document word with an expansion in it")
            else:
                word.append(char)
                i += 1
        if not word:
            raise self.unsure("'<<' without a here-document word")
        self.pending.append(_Heredoc("".join(word), strip, quoted, opened))
        return i

    def step(self, i: int) -> int:
        text, char = self.text, self.text[i]
        kind = self.stack[-1].kind
        if char == "\n":
            self.emit(char)
            return self.newline(i + 1, escaped=False)
        if kind in (SQ, ANSI):
            if char == "\\" and kind == ANSI and not text.startswith("\n", i + 1):
                return i + 2
            if char == "'":
                self.close()
            return i + 1
        if char == "\\":
            if text.startswith("\n", i + 1):
                return self.newline(i + 2, escaped=True)
            self.emit(text[i : i + 2])
            self.prev = "x"
            return i + 2
        if kind == BACKTICK:
            self.emit(char)
            if char == "`":
                self.close()
                return i + 1
            if text.startswith("<<", i) and not text.startswith("<<<", i):
                raise self.unsure("a here-document inside backticks")
            return i + 1
        if char == "$" or char == "`" or char == '"' or (char == "'" and kind in (CODE, SUBST, ARITH)):
            return self.open_quote_or_expansion(i, kind)
        if char == "'" and kind == PARAM and not any(frame.kind == DQ for frame in self.stack):
            self.stack.append(_Frame(SQ))  # inside "${...}" a single quote is literal
            return i + 1
        if kind == DQ:
            self.emit(char)
            return i + 1
        if kind == PARAM:
            return self.in_param(i)
        if kind == ARITH:
            return self.in_arith(i)
        return self.in_code(i, kind)

    def open_quote_or_expansion(self, i: int, kind: str) -> int:
        """A quote, a backtick or a ``$`` expansion at ``i``: part of a word, never a comment."""
        text, char = self.text, self.text[i]
        self.prev = "x"
        if char == '"' and kind == DQ:
            self.emit(char)
            self.stack.pop()
            return i + 1
        opened = {'"': DQ, "'": SQ, "`": BACKTICK}.get(char)
        if opened is None:
            after = text[i + 1 : i + 3]
            if after.startswith("'") and kind != DQ:
                opened, char = ANSI, "$'"
            elif after.startswith('"') and kind != DQ:
                opened, char = DQ, '$"'
            elif after == "((":
                opened, char = ARITH, "$(("
            elif after.startswith("("):
                opened, char = SUBST, "$("
                self.prev = "("  # a comment may start right after $(
            elif after.startswith("{"):
                opened, char = PARAM, "${"
            elif after.startswith("["):
                raise self.unsure("old-style arithmetic $[...]")
            elif after[:1] and after[0] in "#$?!@*-0123456789":
                char = text[i : i + 2]  # $#, $$, $?: a special parameter, not a comment
        self.emit(char)
        if opened is not None:
            self.stack.append(_Frame(opened))
        return i + len(char)

    def close(self) -> None:
        """Leave the innermost frame; what follows continues the same word."""
        self.stack.pop()
        self.prev = "x"

    def in_param(self, i: int) -> int:
        char, frame = self.text[i], self.stack[-1]
        self.emit(char)
        if char == "{":
            frame.depth += 1
        elif char == "}":
            if frame.depth == 0:
                self.close()
            else:
                frame.depth -= 1
        return i + 1

    def in_arith(self, i: int) -> int:
        text, char, frame = self.text, self.text[i], self.stack[-1]
        self.emit(char)
        if char == "(":
            frame.depth += 1
        elif char == ")":
            if frame.depth == 0:
                if not text.startswith(")", i + 1):
                    raise self.unsure("'((' closed by a single ')'")
                self.emit(")")
                self.close()
                return i + 2
            frame.depth -= 1
        return i + 1

    def in_code(self, i: int, kind: str) -> int:
        text, char, frame = self.text, self.text[i], self.stack[-1]
        at_word_start = self.prev in _WORD_BREAK
        if char == "#" and at_word_start:
            end = text.find("\n", i)
            return len(text) if end < 0 else end  # the comment, up to (not including) its newline
        self.emit(char)
        if char not in " \t":
            self.last = (self.last + char)[-2:]
        self.prev = char
        if text.startswith("<<", i):
            if text.startswith("<<<", i):  # a here-string: one word, no body
                self.emit("<<")
                return i + 3
            self.emit("<")
            return self.heredoc_word(i + 2)
        if char in "<>" and text.startswith("(", i + 1):  # process substitution
            self.emit("(")
            self.stack.append(_Frame(SUBST))
            self.prev = "("
            return i + 2
        if char == "(" and at_word_start and text.startswith("(", i + 1):  # (( arithmetic ))
            self.emit("(")
            self.stack.append(_Frame(ARITH))
            return i + 2
        if kind == SUBST:
            if at_word_start and re.match(r"case[ \t\n]", text[i : i + 5]):
                raise self.unsure("'case' inside $(...)")
            if char == "(":
                frame.depth += 1
            elif char == ")":
                if frame.depth == 0:
                    self.close()
                else:
                    frame.depth -= 1
        return i + 1


def scan(text: str) -> list[Line]:
    """Every line of the bash script ``text`` (cut by ``split_lines``), as bash sees it.

    Raises PatchError(UNSURE_SHELL) where the script uses syntax this scanner does not follow.
    """
    return _Scanner(text).run()
