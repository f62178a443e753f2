"""The child side of the JSON-lines protocol every client program speaks with its parent
(`benchfs.procs.LineProcess`): one JSON object per stdout line, one command per stdin line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

Answer = dict[str, Any]
Obey = Callable[[list[str]], Answer]


def say(obj: Answer) -> None:
    """Write one JSON line to stdout and flush it (the parent waits for each line)."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve(session: Callable[[], AbstractContextManager[Obey]]) -> int:
    """Run a client program: `session()` connects and prepares, and gives the function that
    answers one command's words for as long as it is open; `{"ready": true}`, then one answer
    per stdin line until `quit` or end of input. An error of any step is answered as
    `{"error": "Type: message"}` and ends the program with status 1 (the parent reports it;
    a traceback would be lost)."""
    try:
        with session() as obey:
            say({"ready": True})
            for line in sys.stdin:
                words = line.split()
                if not words:
                    continue
                if words[0] == "quit":
                    break
                say(obey(words))
    except Exception as e:
        say({"error": f"{type(e).__name__}: {e}"})
        return 1
    return 0
