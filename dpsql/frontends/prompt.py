"""The interactive prompt of ``dpsql shell``: line editing, history and completion by prompt_toolkit.

Only a person at a terminal gets it; piped standard input and ``-c`` are read as plain text by
:mod:`dpsql.frontends.shell`. Enter runs the input once it holds complete statements (the shell's own
rule, :meth:`dpsql.frontends.shell.Shell.leaves_pending`), else starts a new line, so a statement is
edited and recalled whole: the history file keeps a multi-line statement as one entry. Tab completes
SQL keywords, dot commands, and the names of this connection's tables, views, columns and functions
(every ``dp_*`` macro included); the names are read again after a statement that may change them, never
while typing. Ctrl-C at the prompt clears the input; Ctrl-D on an empty line leaves.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional, Protocol

import duckdb
from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent
from prompt_toolkit.output import create_output

__all__ = ["SqlCompleter", "Host", "session", "read_entries"]


class Host(Protocol):
    """What the prompt needs of the shell it serves (:class:`dpsql.frontends.shell.Shell`; a protocol, so that
    the prompt, which the shell imports, does not import it back)."""

    con: duckdb.DuckDBPyConnection
    done: bool
    completer: Optional["SqlCompleter"]

    def leaves_pending(self, text: str) -> bool: ...

    def dot_command_names(self) -> Iterable[str]: ...

    def feed_entry(self, text: str) -> None: ...

# Names of the catalog, read once per refresh. Functions: every non-internal one and every dp_ one
# (dpsql registers its UDFs as internal), without dpsql's own helpers (dp__...).
_KEYWORDS_SQL = "SELECT DISTINCT keyword_name FROM duckdb_keywords()"
_FUNCTIONS_SQL = r"""
SELECT DISTINCT function_name FROM duckdb_functions()
WHERE function_name NOT LIKE 'dp\_\_%' ESCAPE '\'
  AND (function_name LIKE 'dp\_%' ESCAPE '\' OR NOT internal OR function_type IN ('aggregate', 'table'))
  AND regexp_matches(function_name, '^[A-Za-z_][A-Za-z0-9_]*$')
"""
_RELATIONS_SQL = """
SELECT table_name FROM duckdb_tables() WHERE NOT internal
UNION SELECT view_name FROM duckdb_views() WHERE NOT internal
UNION SELECT database_name FROM duckdb_databases() WHERE NOT internal
"""
_COLUMNS_SQL = "SELECT DISTINCT column_name FROM duckdb_columns() WHERE NOT internal"

# The word being completed: an identifier, or a dot command at the start of the input.
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*$")


class SqlCompleter(Completer):
    """Completes the word before the cursor from the connection's names and DuckDB's keywords.

    The names are read lazily, on the first completion after :meth:`invalidate` (the shell calls it after
    a statement that may have changed the catalog), so typing never queries the database.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, dot_commands: Iterable[str]):
        self.con = con
        self.dot_commands = sorted(dot_commands)
        self.keywords: list[str] = []
        self.names: list[tuple[str, str]] = []  # (name, kind), kind: table, column or function
        self.stale = True

    def invalidate(self, con: Optional[duckdb.DuckDBPyConnection] = None) -> None:
        """Read the names again at the next completion (on ``con``, after ``.open``)."""
        if con is not None:
            self.con = con
        self.stale = True

    def refresh(self) -> None:
        def column(sql: str) -> list[str]:
            try:
                return [row[0] for row in self.con.execute(sql).fetchall()]
            except duckdb.Error:  # a connection in a failed state: complete what is known
                return []

        if not self.keywords:
            self.keywords = sorted(k.upper() for k in column(_KEYWORDS_SQL))
        names: dict[str, str] = {}
        for kind, sql in (("function", _FUNCTIONS_SQL), ("column", _COLUMNS_SQL), ("table", _RELATIONS_SQL)):
            names.update((name, kind) for name in column(sql))  # a table wins over a column of its name
        self.names = sorted(names.items())
        self.stale = False

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        before = document.text_before_cursor
        line = document.current_line_before_cursor
        if document.cursor_position_row == 0 and line.lstrip().startswith(".") and " " not in line.strip():
            word = line.strip()
            for command in self.dot_commands:
                if command.startswith(word.lower()):
                    yield Completion(command, -len(word))
            return
        found = _WORD.search(before)
        if found is None:
            return
        word = found.group(0)
        if self.stale:
            self.refresh()
        lower = word.lower()
        for name, kind in self.names:
            if name.lower().startswith(lower):
                yield Completion(name, -len(word), display_meta=kind)
        # Keywords in the case the word is typed in (select -> select, SEL -> SELECT).
        for keyword in self.keywords:
            if keyword.startswith(word.upper()):
                yield Completion(keyword if word.isupper() else keyword.lower(), -len(word), display_meta="keyword")


class _QuietFileHistory(FileHistory):
    """The history file; a history that cannot be written (an unwritable home) is not an error for a prompt."""

    def load_history_strings(self) -> Iterable[str]:
        try:
            return list(super().load_history_strings())
        except OSError:
            return []

    def store_string(self, string: str) -> None:
        try:
            super().store_string(string)
        except OSError:
            pass


def _history(name: str) -> History:
    try:
        return _QuietFileHistory(str(Path.home() / name))
    except (RuntimeError, KeyError):  # no resolvable home directory
        return InMemoryHistory()


def session(shell: Host, history_file: str, prompt: str, continuation: str) -> "PromptSession[str]":
    """A prompt on ``shell``'s connection: Enter runs complete input, else continues it on a new line."""
    bindings = KeyBindings()

    @bindings.add("enter")
    def _enter(event: KeyPressEvent) -> None:
        buffer = event.current_buffer
        # Only at the end of the input: Enter inside it (an edit of a recalled statement) breaks the line.
        if buffer.document.is_cursor_at_the_end and not shell.leaves_pending(buffer.text):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    @bindings.add("escape", "enter")  # Alt-Enter runs what is typed, finished or not
    def _run_anyway(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    completer = SqlCompleter(shell.con, shell.dot_command_names())
    shell.completer = completer
    return PromptSession(
        message=prompt, multiline=True, key_bindings=bindings, history=_history(history_file),
        completer=completer, complete_while_typing=False,
        prompt_continuation=lambda width, line_number, wrap_count: continuation,
        # With results sent to a file (dpsql shell > out.txt) the prompt is drawn on the terminal of stderr.
        output=create_output(always_prefer_tty=True),
    )


def read_entries(shell: Host, history_file: str, prompt: str, continuation: str) -> None:
    """Prompt until ``.quit`` or Ctrl-D, handing each entry to the shell."""
    prompt_session = session(shell, history_file, prompt, continuation)
    while not shell.done:
        try:
            text = prompt_session.prompt()
        except KeyboardInterrupt:  # Ctrl-C clears the input, as in DuckDB's CLI
            continue
        except EOFError:
            break
        shell.feed_entry(text)
